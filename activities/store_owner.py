"""What every activity class that writes outputs shares: the worker's one output store, or, when
a test or a tool gives none, a store of its own, opened at first use and closed by `aclose()`."""

from __future__ import annotations

from activities.storage import OutputStore
from activities.store_opening import LazyOutputStore
from spillway.settings import Settings


class OwnsOutputStore:
    _store: OutputStore
    _own_store: LazyOutputStore | None = None

    def _use_store(self, settings: Settings, store: OutputStore | None) -> OutputStore:
        if store is None:
            store = self._own_store = LazyOutputStore(settings)
        self._store = store
        return store

    async def aclose(self) -> None:
        """Closes the output store these activities opened themselves, if any."""
        if self._own_store is not None:
            await self._own_store.aclose()
