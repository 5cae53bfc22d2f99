"""The interface every method implements: a `Method` and its runner (the contract of every field and
call: docs/development.md, "The full interface")."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  presets: Mapping[str, Any]
  first_session: Callable
  runner: Callable
  description: str = ''
  section: str = ''
  validate: Optional[Callable] = None
