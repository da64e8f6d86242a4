"""The /dev/shm fact: its size and free space (statvfs), judged by resolve/shm.py and the rules in resolve/compat.py."""

from __future__ import annotations

from pyinfra.api import FactBase

from resolve.shm import SHM_COMMAND, ShmSpace, parse_shm


class DevShm(FactBase):
    """/dev/shm's size and the bytes free in it (``ShmSpace``); a ``problem`` when the host has none.

    Read with the other planning facts, in the same round trip (operations/factbatch.py).
    """

    def command(self) -> str:
        return SHM_COMMAND

    def default(self) -> ShmSpace:
        return ShmSpace(problem="stat -f /dev/shm printed nothing")

    def process(self, output: list[str]) -> ShmSpace:
        return parse_shm(output)
