"""python run.py --config CONFIG --workdir DIR [--mode train|eval|bench|flatness] [--checkpoint W]
                                   [--dry-run]

CONFIG is a config file (configs/cifar100.py:smoke) or a workdir's config.json; without --config,
--workdir's own config.json. f2m_jax.run.cli defines, parses and acts on the flags.
"""
import signal

# First, before any import: SIGINT and SIGTERM wait (blocked) until the watcher serves them, so
# that one sent during the imports below (seconds) ends the process with one line
# (f2m_jax/run/stopping.py; before this line the interpreter starts: docs/development.md, "When a
# run stops").
signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM))

# pylint: disable=g-import-not-at-top,wrong-import-position
from f2m_jax.run import stopping

stopping.watch()

import sys

from absl import app, flags

from f2m_jax.run import cli

cli.define_flags()
flags.adopt_module_key_flags(cli)

if __name__ == '__main__':
  sys.stdout.reconfigure(line_buffering=True)  # each line out as printed, into a file or pipe too
  sys.exit(app.run(cli.main_flags, flags_parser=cli.parse_flags))
