"""What one pyinfra run keeps beside its hosts: the callback handlers heavylift adds to the run's State (the
wave board, the node groups' board, the status documents, the locks to give back). pyinfra calls them at its
events (``BaseStateCallback``); keeping them on the State, not in module globals, gives each run its own."""

from typing import Callable, TypeVar

Handler = TypeVar("Handler")


def handler_of(state, kind: type[Handler], make: Callable[[], Handler] | None = None,
               added: Callable[[Handler], None] | None = None) -> Handler:
    """The run's one ``kind`` handler: the one ``state`` has, else ``make()`` (``kind()``) added to its callback
    handlers, and ``added(handler)`` called once, when it is added (e.g. to say so in the run's output)."""
    handler = next((h for h in state.callback_handlers if isinstance(h, kind)), None)
    if handler is None:
        handler = make() if make else kind()
        state.add_callback_handler(handler)
        if added:
            added(handler)
    return handler
