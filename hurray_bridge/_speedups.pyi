from collections.abc import Callable
from typing import Any

class Dispatcher:
    general: Callable[..., Any]
    table: dict[type, dict[str, tuple[Any, ...] | None]]
    def __init__(self, general: Callable[..., Any],
                 table: dict[type, dict[str, tuple[Any, ...] | None]]) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

def capsule_hooks(exports: dict[int, Any], name_v: bytes, name_l: bytes) -> tuple[int, int]: ...
