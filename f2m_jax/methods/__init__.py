"""The interface every method implements: a `Method` and its runner (the contract of every field and
call: docs/development.md, "The full interface")."""
import dataclasses
from typing import Callable, Optional


@dataclasses.dataclass(frozen=True)
class Method:
  name: str
  presets: dict  # {dotted field: value}
  first_session: Callable
  runner: Callable
  description: str = ''
  section: str = ''
  validate: Optional[Callable] = None
