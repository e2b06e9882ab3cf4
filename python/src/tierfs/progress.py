"""Progress of long operations (sync, restore): a ``tqdm.auto`` bar, or plain text lines.

``tqdm.auto`` draws a widget in Jupyter when ipywidgets is installed and a text bar
otherwise; without tqdm at all, :class:`Progress` prints a line every few seconds to
stderr. Nothing is shown for an operation that ends within :data:`SHOW_AFTER_SECS` unless
asked for (``show=True``), so quick syncs stay quiet.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
from typing import Any

from .status import format_bytes

__all__ = ["Progress", "SHOW_AFTER_SECS"]

#: With ``show=None``, progress appears once an operation has run this long (seconds).
SHOW_AFTER_SECS = 1.0

#: Plain-text progress prints at most one line per this many seconds.
_TEXT_EVERY_SECS = 5.0


def _tqdm_class() -> Any | None:
    try:
        with warnings.catch_warnings():
            # tqdm.auto warns when ipywidgets is missing and falls back to text: that
            # fallback is intended here, not worth a warning in every notebook.
            warnings.simplefilter("ignore")
            from tqdm.auto import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        return None
    return tqdm


class Progress:
    """A byte counter shown as a progress bar.

    Args:
        desc: what is in progress (the bar's label).
        total: bytes expected, or ``None`` when unknown (the bar then counts up).
        show: ``True`` always, ``False`` never, ``None`` once the operation takes longer
            than :data:`SHOW_AFTER_SECS`.
    """

    def __init__(self, desc: str, total: int | None, show: bool | None = None) -> None:
        self.desc = desc
        self.total = total
        self.show = show
        self.done = 0
        self._started = time.monotonic()
        self._bar: Any = None
        self._text_at = 0.0
        self._shown = False
        self._lock = threading.Lock()

    def _maybe_open(self) -> None:
        """Opens the bar once it is due: at the first news with ``show=True``, after
        :data:`SHOW_AFTER_SECS` with ``show=None``."""
        if self._shown or self.show is False:
            return
        if self.show or time.monotonic() - self._started >= SHOW_AFTER_SECS:
            self._open()

    def _open(self) -> None:
        self._shown = True
        tqdm = _tqdm_class()
        if tqdm is None:
            self._text(force=True)
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._bar = tqdm(
                total=self.total,
                initial=self.done,
                desc=self.desc,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                leave=True,
                file=sys.stderr,
            )

    def _text(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._text_at < _TEXT_EVERY_SECS:
            return
        self._text_at = now
        of = f" of {format_bytes(self.total)}" if self.total else ""
        print(f"{self.desc}: {format_bytes(self.done)}{of}", file=sys.stderr, flush=True)

    def set_total(self, total: int | None) -> None:
        """Changes the expected total (more data arrived while the operation ran)."""
        with self._lock:
            self.total = total
            if self._bar is not None:
                self._bar.total = total
                self._bar.refresh()
            self._maybe_open()

    def update_to(self, done: int) -> None:
        """Sets the bytes done so far; the counter never goes backwards."""
        with self._lock:
            if done <= self.done and self._shown:
                return
            step = max(0, done - self.done)
            self.done = max(self.done, done)
            if not self._shown:
                self._maybe_open()
            elif self._bar is not None:
                self._bar.update(step)
            else:
                self._text()

    def close(self) -> None:
        """Ends the bar (a final line for plain text). With ``show=True`` a bar that never
        opened (the operation ended before any news) is shown once, complete."""
        with self._lock:
            if not self._shown and self.show:
                self._open()
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            elif self._shown:
                self._text(force=True)
            self._shown = False
            self.show = False
