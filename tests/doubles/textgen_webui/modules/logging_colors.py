"""Test double of modules.logging_colors: the web UI's own logger.

As the host's: the logger is named 'textgen', importing the module replaces its handlers, and
``logger.buffer`` keeps the last records it printed (the host's RingBuffer). The host also sends
the root logger to a ``NullHandler`` (``logging.basicConfig(handlers=[NullHandler()])``); the
double leaves the test process's root logger alone, and a test that depends on that sets it
itself. The host prints through rich's console; the double keeps the formatted lines only."""

import logging

logger = logging.getLogger("textgen")


class _RingBuffer(logging.Handler):
    def __init__(self, capacity):
        super().__init__()
        self.capacity = capacity
        self.buffer = []

    def emit(self, record):
        self.buffer.append(self.format(record))
        if len(self.buffer) > self.capacity:
            self.buffer.pop(0)


logger.setLevel(logging.DEBUG)
while logger.handlers:
    logger.removeHandler(logger.handlers[0])
_ring = _RingBuffer(100)
logger.addHandler(_ring)
logger.buffer = _ring.buffer
