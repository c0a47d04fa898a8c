"""The memory half's choices (policy/preempt-memory.h), driven through llama_preempt._core with no
model: which cached prompt file matches a request, whether it is read back or prefilled, whose file
is read ahead, which files give way to a park, and the copy guard's reaction. The server's prompt
cache and copy guard carry out these same compiled functions (tests/test_prompt_disk.py and
tests/test_swap_copy.py prove them live)."""
from __future__ import annotations

from llama_preempt import _core

W = _core.PromptReadWhy
MIB = 1 << 20


def rates(prefill_tps: float = 1000.0, disk_read_bps: float = 1e9, restore_bps: float = 4e9) -> _core.CostRates:
    r = _core.CostRates()
    r.prefill_tps, r.disk_read_bps, r.restore_bps = prefill_tps, disk_read_bps, restore_bps
    return r


def file(tokens: list[int], n_bytes: int = MIB, written: bool = True) -> tuple[list[int], int, bool]:
    return (tokens, n_bytes, written)


SYSTEM = list(range(100, 400))  # a 300-token shared prefix


def test_the_file_sharing_the_longest_prefix_matches() -> None:
    files = [file(SYSTEM[:100]), file(SYSTEM + [1, 2, 3]), file(SYSTEM[:200] + [9])]
    assert _core.match_prompt_file(files, SYSTEM + [1, 2, 7]) == (1, 302)


def test_a_long_file_is_not_matched_by_a_short_shared_prefix() -> None:
    # upstream's rule for its RAM cache: at least a quarter of the cached prompt must be shared
    long_file = SYSTEM + list(range(1000, 1900))  # 1,200 tokens
    assert _core.match_prompt_file([file(long_file)], SYSTEM[:299]) == (-1, 0)
    assert _core.match_prompt_file([file(long_file)], SYSTEM) == (0, 300)


def test_a_file_is_read_back_when_it_saves_more_than_ram_and_costs_less_than_the_prefill() -> None:
    c = _core.choose_prompt_read([file(SYSTEM, 8 * MIB)], SYSTEM + [5], n_ram_common=0, host_room=64 * MIB, rates=rates())
    assert (c.why, c.file, c.n_common, c.read) == (W.READ_BACK, 0, 300, True)


def test_no_read_back_when_the_ram_cache_holds_as_much() -> None:
    c = _core.choose_prompt_read([file(SYSTEM, 8 * MIB)], SYSTEM + [5], n_ram_common=300, host_room=64 * MIB, rates=rates())
    assert (c.why, c.read) == (W.RAM_AS_GOOD, False)


def test_the_prefill_wins_when_the_disk_is_slower_than_recomputing() -> None:
    # 300 tokens at 1,000 tokens/s: 0.3 s; 8 MiB at 1 MB/s: over 8 s
    slow_disk = rates(disk_read_bps=1e6)
    c = _core.choose_prompt_read([file(SYSTEM, 8 * MIB)], SYSTEM, n_ram_common=0, host_room=64 * MIB, rates=slow_disk)
    assert c.why == W.PREFILL_CHEAPER
    fast = _core.choose_prompt_read([file(SYSTEM, 8 * MIB)], SYSTEM, n_ram_common=0, host_room=64 * MIB, rates=rates())
    assert fast.why == W.READ_BACK


def test_a_file_larger_than_the_host_room_is_streamed_straight_into_the_slot() -> None:
    c = _core.choose_prompt_read([file(SYSTEM, 8 * MIB)], SYSTEM, n_ram_common=0, host_room=4 * MIB, rates=rates())
    assert (c.why, c.file, c.read, c.stream) == (W.STREAM_BACK, 0, False, True)
    # without a slot to stream into (a read ahead for a waiting request), or cells for its tokens in the
    # pool now (the other slots' are still held while upstream loads), it is not
    for cells in (0, len(SYSTEM) - 1):
        c = _core.choose_prompt_read([file(SYSTEM, 8 * MIB)], SYSTEM, n_ram_common=0, host_room=4 * MIB, rates=rates(),
                                     stream_cells=cells)
        assert (c.why, c.file, c.read, c.stream) == (W.NO_ROOM, 0, False, False)
    c = _core.choose_prompt_read([file(SYSTEM, 8 * MIB)], SYSTEM, n_ram_common=0, host_room=4 * MIB, rates=rates(),
                                 stream_cells=len(SYSTEM))
    assert c.why == W.STREAM_BACK
    # the cost rule first: a file that would take longer than its prefill is not streamed either
    slow = _core.choose_prompt_read([file(SYSTEM, 8 * MIB)], SYSTEM, n_ram_common=0, host_room=4 * MIB,
                                    rates=rates(disk_read_bps=1e6))
    assert slow.why == W.PREFILL_CHEAPER


def test_no_file_no_match() -> None:
    c = _core.choose_prompt_read([file([1, 2, 3])], [7, 8, 9], n_ram_common=0, host_room=64 * MIB, rates=rates())
    assert (c.why, c.file) == (W.NO_MATCH, -1)


def read_back(i: int) -> _core.PromptReadChoice:
    c = _core.PromptReadChoice()
    c.why, c.file, c.n_common = W.READ_BACK, i, 100
    return c


def test_the_waiting_requests_file_is_read_ahead_once_written() -> None:
    files = [file([1] * 100), file([2] * 100)]
    assert _core.choose_read_ahead(files, read_back(1), held=-1) == (1, False, True)
    # already held: nothing to do
    assert _core.choose_read_ahead(files, read_back(1), held=1) == (1, False, False)
    # still being written: nothing to read yet
    assert _core.choose_read_ahead([file([1] * 100), file([2] * 100, written=False)], read_back(1), held=-1) == (-1, False, False)


def test_a_read_ahead_nobody_wants_any_more_goes() -> None:
    files = [file([1] * 100), file([2] * 100)]
    assert _core.choose_read_ahead(files, _core.PromptReadChoice(), held=0) == (-1, True, False)
    # the waiting request now wants another file: the one held goes, the other is read
    assert _core.choose_read_ahead(files, read_back(1), held=0) == (1, True, True)
    # a request that prefills instead wants nothing read ahead
    prefill = read_back(1)
    prefill.why = W.PREFILL_CHEAPER
    assert _core.choose_read_ahead(files, prefill, held=1) == (-1, True, False)


def test_the_oldest_prompt_files_give_way_to_a_park_until_it_fits() -> None:
    sizes = [3 * MIB, 2 * MIB, 5 * MIB]  # oldest first
    assert _core.prompt_files_to_drop(sizes, room=10 * MIB, n_bytes=4 * MIB) == 0
    assert _core.prompt_files_to_drop(sizes, room=2 * MIB, n_bytes=4 * MIB) == 1
    assert _core.prompt_files_to_drop(sizes, room=0, n_bytes=6 * MIB) == 3
    assert _core.prompt_files_to_drop(sizes, room=0, n_bytes=100 * MIB) == 3  # all, and still no room


def test_the_copy_guard_moves_a_device_to_single_slices_then_turns_swap_off() -> None:
    assert _core.react_to_wrong_copy(per_slice_already=False, used_faster_route=True) == "per_slice"
    assert _core.react_to_wrong_copy(per_slice_already=True, used_faster_route=True) == "swap_off"
    assert _core.react_to_wrong_copy(per_slice_already=False, used_faster_route=False) == "swap_off"


class Cache(_core.HostCache):
    """A prompt cache of equal entries, least recently used first: what the budget caps."""

    def __init__(self, entries: int, entry_bytes: int) -> None:
        super().__init__()
        self.entries, self.entry_bytes = entries, entry_bytes
        self.limits: list[int] = []

    def cap(self, limit: int) -> bool:
        self.limits.append(limit)
        if self.entries * self.entry_bytes <= limit:
            return False
        self.entries = limit // self.entry_bytes
        return True



def test_a_park_makes_cached_prompts_give_way_and_the_freed_pages_go_back() -> None:
    cache = Cache(entries=6, entry_bytes=10 * MIB)  # 60 MiB cached
    ram = _core.HostRam(host_kv_ram_mib=64, preempt_ram_mib=-1, cache_ram_mib=-1, cache=cache)
    assert ram.reserve(parked=0, ahead=0, bytes=30 * MIB, use=_core.HostUse.PARK)
    assert cache.limits[-1] == 34 * MIB and cache.entries == 3  # parks first: the cache keeps what is left
    assert ram.n_trims == 1
    # the park is held now: released, the cache's limit follows what is held, no more trims
    ram.release(parked=30 * MIB, ahead=0)
    assert cache.limits[-1] == 34 * MIB and ram.n_trims == 1


def test_a_park_beyond_the_parks_cap_is_refused_and_a_disk_parks_bytes_always_pass() -> None:
    ram = _core.HostRam(host_kv_ram_mib=64, preempt_ram_mib=16, cache_ram_mib=-1, cache=Cache(0, MIB))
    assert ram.reserve(parked=10 * MIB, ahead=0, bytes=6 * MIB, use=_core.HostUse.PARK)
    assert not ram.reserve(parked=10 * MIB, ahead=0, bytes=7 * MIB, use=_core.HostUse.PARK)
    assert ram.reserve(parked=10 * MIB, ahead=0, bytes=200 * MIB, use=_core.HostUse.TRANSIT)


def test_a_prompt_file_comes_back_only_within_what_parks_leave() -> None:
    cache = Cache(entries=2, entry_bytes=8 * MIB)
    ram = _core.HostRam(host_kv_ram_mib=64, preempt_ram_mib=-1, cache_ram_mib=32, cache=cache)
    assert ram.cache_room(parked=40 * MIB, ahead=0) == 24 * MIB
    assert ram.reserve(parked=40 * MIB, ahead=0, bytes=20 * MIB, use=_core.HostUse.PROMPT_READ)
    assert cache.entries == 0  # 16 MiB cached gave way to the 20 coming in (4 MiB left of 24)
    assert not ram.reserve(parked=40 * MIB, ahead=0, bytes=25 * MIB, use=_core.HostUse.PROMPT_AHEAD)


def test_the_cache_grows_back_as_parked_slots_resume() -> None:
    cache = Cache(entries=0, entry_bytes=MIB)
    ram = _core.HostRam(host_kv_ram_mib=64, preempt_ram_mib=-1, cache_ram_mib=48, cache=cache)
    ram.settle(parked=60 * MIB, ahead=0)
    assert cache.limits[-1] == 4 * MIB
    ram.settle(parked=0, ahead=2 * MIB)  # a read ahead counts with the cache's bytes
    assert cache.limits[-1] == 48 * MIB and ram.n_trims == 0


def test_without_a_limit_or_a_cache_the_budget_says_yes() -> None:
    cache = Cache(entries=3, entry_bytes=MIB)
    ram = _core.HostRam(host_kv_ram_mib=-1, preempt_ram_mib=-1, cache_ram_mib=-1, cache=cache)
    assert ram.reserve(parked=2**40, ahead=0, bytes=2**40, use=_core.HostUse.PARK)
    assert cache.limits[-1] > 2**63 and cache.entries == 3  # a budget of no limit leaves the cache none either
    lone = _core.HostRam(host_kv_ram_mib=64, preempt_ram_mib=-1, cache_ram_mib=0)
    assert lone.reserve(parked=0, ahead=0, bytes=32 * MIB, use=_core.HostUse.PARK)
    assert not lone.reserve(parked=0, ahead=0, bytes=1, use=_core.HostUse.PROMPT_READ)  # no prompt cache: no room
