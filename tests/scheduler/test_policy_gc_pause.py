"""The dispatch round and the snapshot read pause Python's cyclic garbage collector."""

import gc

import pytest

from apps.scheduler.policy import garbage_collector_paused


@pytest.fixture
def collector_on():
    was_on = gc.isenabled()
    gc.enable()
    yield
    if not was_on:
        gc.disable()


def test_the_collector_is_paused_inside_the_block_and_resumed_after(collector_on):
    with garbage_collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_resumes_when_the_block_raises(collector_on):
    with pytest.raises(RuntimeError), garbage_collector_paused():
        raise RuntimeError("a round that failed")
    assert gc.isenabled()


def test_a_collector_its_caller_paused_stays_paused(collector_on):
    gc.disable()
    with garbage_collector_paused():
        pass
    assert not gc.isenabled()


def test_blocks_nest(collector_on):
    with garbage_collector_paused():
        with garbage_collector_paused():
            pass
        assert not gc.isenabled()  # the outer block still holds it
    assert gc.isenabled()
