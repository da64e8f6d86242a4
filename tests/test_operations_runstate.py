"""operations/runstate.py: each run keeps one handler of a kind, on its own State."""

from pyinfra.api import BaseStateCallback, Config, Inventory, State

from operations.runstate import handler_of


class Board(BaseStateCallback):
    made = 0

    def __init__(self, name="board"):
        Board.made += 1
        self.name = name


def new_state():
    return State(Inventory((["one"], {})), Config())


def test_the_first_ask_adds_the_handler_and_the_next_asks_get_the_same_one():
    state, said = new_state(), []
    first = handler_of(state, Board, make=lambda: Board("first"), added=said.append)
    again = handler_of(state, Board, make=lambda: Board("second"), added=said.append)
    assert again is first and first.name == "first"
    assert said == [first]  # told once, when it was added
    assert [h for h in state.callback_handlers if isinstance(h, Board)] == [first]


def test_two_runs_never_share_a_handler():
    one, two = new_state(), new_state()
    assert handler_of(one, Board) is not handler_of(two, Board)
