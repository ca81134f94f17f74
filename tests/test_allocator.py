"""The BFC allocator model against TensorFlow's algorithm, derived by hand."""

from keras_memscope.allocator import BFCModel, ExactModel

MiB = 1 << 20


def test_first_region_is_2_mib_and_small_requests_split_it():
    a = BFCModel()
    h, counted = a.alloc(1000)
    assert counted == 1024  # rounded to 256 and split off the 2 MiB region
    assert a.total_region_bytes == 2 * MiB
    a.free(h)
    assert a.in_use == 0


def test_unsplit_chunk_counts_whole():
    # 19.6 MB does not fit the 2 MiB region; the region size doubles to 32 MiB,
    # which is less than twice the request, so the whole chunk is in use.
    a = BFCModel()
    a.alloc(100)
    _, counted = a.alloc(19_663_488)
    assert counted == 32 * MiB
    assert a.total_region_bytes == 2 * MiB + 32 * MiB


def test_regions_double_after_each_growth():
    a = BFCModel()
    a.alloc(2 * MiB)        # fills the first 2 MiB region exactly
    a.alloc(1 * MiB)        # new region of 4 MiB (doubled), split
    assert a.total_region_bytes == 6 * MiB
    a.alloc(4 * MiB)        # 3 MiB left is too small: a new region of 8 MiB
    assert a.total_region_bytes == 14 * MiB


def test_a_new_region_lies_below_and_a_tie_takes_its_chunk():
    """Among free chunks of one size the allocator takes the lowest address;
    the operating system maps each new region below the earlier ones, so a
    tie goes to the newest region's chunk."""
    a = BFCModel()
    first, _ = a.alloc(1 * MiB)    # the 2 MiB region, split
    b, _ = a.alloc(1 * MiB)        # its other half
    c, _ = a.alloc(1 * MiB)        # a new 4 MiB region, split
    a.alloc(3 * MiB)               # the rest of it
    assert c < first
    a.free(b)
    a.free(c)                      # a free 1 MiB chunk in each region
    again, counted = a.alloc(1 * MiB)
    assert (again, counted) == (c, 1 * MiB)


def test_free_chunks_coalesce():
    a = BFCModel()
    h1, _ = a.alloc(512 * 1024)
    h2, _ = a.alloc(512 * 1024)
    a.free(h1)
    a.free(h2)
    # the whole 2 MiB region is one free chunk again: a 2 MiB request fits it
    _, counted = a.alloc(2 * MiB)
    assert counted == 2 * MiB
    assert a.total_region_bytes == 2 * MiB


def test_peak_and_reset():
    a = BFCModel()
    h, _ = a.alloc(1 * MiB)
    a.free(h)
    assert a.peak == 1 * MiB
    a.reset_peak()
    assert a.peak == 0


def test_exact_model_rounds_only():
    a = ExactModel()
    h, counted = a.alloc(1)
    assert counted == 256
    a.free(h)
    assert a.in_use == 0 and a.peak == 256


def test_replaying_a_real_process_gives_the_allocators_own_counts():
    """Every allocation and deallocation of TensorFlow's BFC allocator in a
    fresh process (the zoo's small CNN built and trained four steps at batch
    128 under Adam, from the profiler's trace), replayed through
    ``BFCModel``: after each event the model counts the bytes in use that
    TensorFlow counted. (With its regions placed upward, the replay of one
    such trace parted from TensorFlow's count at 56 of its last 116
    events; of MobileNetV2's and the Transformer's, by up to 47 MiB:
    ``python -m benchmarks.allocator_replay``.) The events are taken in the
    allocator's order, which the profiler's timestamps can leave for two
    threads' events close in time (once in about thirty runs, by 256 bytes
    at one event)."""
    from benchmarks.allocator_replay import PROFILED_RUN, in_allocator_order, record, replay

    events, moved = in_allocator_order(record(PROFILED_RUN, ["cnn", "128", "", "4"],
                                              timeout=300))
    assert len(events) > 1000 and moved <= 4, moved
    replayed = replay(events)
    assert [e[3] for e in events] == replayed


def test_events_put_back_in_the_allocators_order():
    """Two events the profiler recorded the other way round (a 256-byte
    allocation before a free whose count says it came first) are swapped
    back; events whose counts follow from the one before stay."""
    from benchmarks.allocator_replay import in_allocator_order

    # [allocated?, address, requested, in use after, chunk]
    real = [[True, 1, 1000, 1024, 1024], [True, 2, 2000, 3072, 2048],
            [False, 1, 1000, 2048, 1024], [True, 3, 100, 2304, 256],
            [False, 2, 2000, 256, 2048]]
    recorded = [real[0], real[1], real[3], real[2], real[4]]
    assert in_allocator_order(recorded) == (real, 1)
    assert in_allocator_order(real) == (real, 0)
