"""The rates of the cost model (:mod:`.cost`) that differ between kinds of CPU: one record per kind."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Rates:
    """The rates that differ between kinds of CPU (the rest of the model is shared).

    - ``blas_macs``: BLAS_MACS, a product's multiply-adds per second and core at full size;
    - ``loop_macs``: LOOP_MACS, the dense loops' multiply-adds per second and core on long rows;
    - ``loop_weights``, ``loop_big_weights``: the dense loops' time is multiplied by ``loop_big_weights`` when one
      group's weights hold ``loop_weights`` elements or more (past a core's L2 every block of positions streams them
      again), or by less on a ramp (``loop_weights_ramp``: :func:`.cost.big_weights`);
    - ``loop_long_row``: output rows at least this long keep a block of output channels' weights in cache along the
      row: no ``loop_big_weights`` for the strided forward (None: never);
    - ``stem_macs``: STEM_MACS, the stem loops' multiply-adds per second and core (times Co / (Co + STEM_K0));
    - ``grid_forward``: the grid engine's forward (``blas_grid``) takes this many times its products and copies;
    - ``forward_chunks``, ``forward_columns``: colgemm's forward serves calls in at most ``forward_chunks`` chunks of
      samples where the dense loops could take it, and of at most ``forward_columns`` output positions (N x spatial)
      (Zen 4: one chunk, a stride-1 2x256x14x14 in two ran 2.8 ms against the dense loops' 2.45; 4096 positions, past
      which the copy back to (N, C, spatial) cost more than the model counts: a 1x1 at 8x28x28, 256 -> 128, 10-16 ms
      against the grid loops' 6);
    - ``loop_weights_ramp``, ``loop_sample_bytes``: with a ramp of n octaves (0: a step), the big-weights factor rises
      from 1 at ``loop_weights`` elements to ``loop_big_weights`` at 2^n times as many (log scale), where one sample's
      data for the loops (x or dy, channel-major) holds at most ``loop_sample_bytes`` (None: any); past it, the step
      (each channel block of the weights streams the sample again from beyond L2: the speech encoder's 512-channel
      rows of 3199);
    - ``loop_weights_2d``: for 2-D and 3-D kernels this threshold instead of ``loop_weights`` (None: the same). Zen 4,
      two threads, ms (dense / colgemm): 256x256x3x3 weights (2^19.2 elements) at 8x4x4 forward 0.89 / 1.08, input
      gradient 0.98 / 1.24; at 2x14x14 input gradient 2.43 / 2.95, weight gradient 2.81 / 3.10; the 3-D net's
      256x128x3x3x3 (2^19.8) at 2x2x7x7 forward 1.58 / 2.56; but 512x256x3x3 (2^20.2) at 2x14x14 s2, input and weight
      gradients, 2.17 / 1.64 and 1.89 / 1.64, and the 1-D encoder's 512x512x2 (2^19) weight gradient 2.09 / 1.52 (so
      1-D keeps ``loop_weights``);
    - ``small_cols_call``: :data:`.cost.SMALL_COLS_CALL` where set (0: none);
    - ``loop_big_weights_fwd``: the stride-1 forward's ``loop_big_weights`` where set (None: the same). Zen 4, issue
      25's twelfth session, two threads, min of 40 alternating, ms (dense / colgemm / torch): ResNet-18 224's
      2x512x7x7 -> 512 3x3 forward, warm, 2.80-2.82 / 3.44-3.49 / 2.63-2.67 once the loops skipped the padding's
      columns (its backward keeps colgemm, 6.5-7.2 against the loops' 8.1-8.9: the factor is the forward's alone,
      1.2); of 2823 random forwards the candidates weigh, 127 then picked the loops, eight measured warm 15-60% faster
      (16x256x7x7 -> 256 5x5 9.2 against small-c-blocks' 21.7 ms, 1x256x28x28 -> 512 9.0 against grid-forward's 15.0).
      With its weights cold, as in a model, that forward ran 3.69 / 3.24 and 8x512x4x4 -> 256 2.38 / 2.27:
      :data:`.cost.WEIGHT_COPY` now gives both to colgemm. AVX-512 builds (:data:`BIG_WEIGHTS_FWD_ISAS`; the AVX2 build
      where its rows run taps at a time, ``avx2``'s 1.0);
    - ``split_call``: :data:`.cost.SPLIT_CALL` where set (None: dx and dw are each the cheapest alone,
      :func:`.cost.backward_pair`);
    - ``strided_q0``: the Q0 of the dense loops' strided forward on rows shorter than ``dense.STRIDED_MIN_ROW`` (None:
      such rows cost infinity, never picked). Zen 4, issue 25's ninth session, each in lane runs (the public call's
      repeated form), alternating in one process, ms, loops / colgemm / torch: ResNet-18 64's 8x128x8x8 -> 256 3x3
      stride 2 (4x4 outputs, rows of 4) two threads 0.58-1.07 / 0.73-1.32 / 0.46-0.75 over four rounds, one thread
      0.88 / 1.11-1.24; Q0 10 costed the loops 0.59 against colgemm's 0.55, 5 costs them 0.49. Rows of 2 keep colgemm
      (8x256x4x4 -> 512 s2: 0.93 / 0.68 / 0.62) and so do 512x256x3x3 weights at 7x7 outputs (2x256x14x14 s2: 2.32 /
      2.13 / 1.53).
    - ``pointwise_fwd``: where set, the pointwise forward's products at this times their estimate, its jobs in rounds
      of the cores, where its sgemm table builds (None: as fitted before, N * g / CORES). Zen 4, issue 25's
      fourteenth session, two threads, min of 9 alternating: over 29 1x1 stride-1 forwards (MobileNetV2's, ResNet-50's
      bottleneck 1x1s, U-Net's head) measured/estimated 0.25-1.14, median 0.79 (no copies: x and y read and written in
      place, where colgemm and the grid engine copy both); the model had picked colgemm or the grid engine for 12 of
      them at 1.4-3.4x pointwise's time (32x64x8x8 -> 64: 443 against 130 us; 8x128x64x64 -> 8: 2.26 against 1.46 ms),
      geomean regret 1.23, now 1.03 (the largest two small calls, now on pointwise too: paths._pointwise_forward).
    - ``stem_grid``: the small loops in sample blocks (``small-c-blocks``, :func:`.cost.grid`) at this times their
      forward's estimate where the stem loops serve the forward (``stem.serves(p)``: a stem's few input channels, one
      group, rows of 16 or more). Zen 3, issue 25's nineteenth session, two threads, ms, small-c-blocks / stem
      (estimated 1.42 / 2.41 and 0.19 / 0.30 before): the 3-D net's 2x3x8x56x56 -> 32 3x3x3 2.60 / 2.29, the U-Net's
      4x3x64x64 -> 32 3x3 0.71 / 0.60, 8x3x32x32 -> 32 0.40 / 0.34, 2x3x16x112x112 -> 32 23.5 / 20.0, 4x3x128x128
      -> 64 3.14 / 2.15, 8x3x64x64 -> 24 5x5 1.24 / 1.10 (the same bits: both sum the taps in one order); the AVX2
      build's rates only (``avx2``: 2.0).
    ``small_cols_call``, ``split_call`` and ``pointwise_fwd`` were measured on Zen 4 only: Intel keeps the picks it
    had."""

    blas_macs: float
    loop_macs: float
    loop_weights: int
    loop_big_weights: float
    loop_long_row: int | None
    stem_macs: float
    grid_forward: float
    forward_chunks: int
    forward_columns: int
    loop_weights_ramp: int = 0
    loop_sample_bytes: int | None = None
    loop_weights_2d: int | None = None
    small_cols_call: float = 0.0
    split_call: float | None = None
    strided_q0: int | None = None
    loop_big_weights_fwd: float | None = None
    pointwise_fwd: float | None = None
    stem_grid: float = 1.0
