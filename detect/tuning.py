"""The detector's tuned constants: the numbers its rules were fitted with.

They are not `Settings`: a user tunes the rules' thresholds there (ratios,
windows), while these set how the statistics behind them are estimated, and
the tests and benches were fitted with them. Each says why it has its value;
DETECTOR.md describes the rules they serve.
"""

from __future__ import annotations

# The island of a rank that names none (no summary island, no vendor, no config).
DEFAULT_ISLAND = "default"

# Diagnosis compares a rank's telemetry with its peers' medians; past this many
# peers an evenly spaced sample of them gives the same medians for far less work.
DIAG_PEERS = 256

# The adaptive rank rule (settings.mode = "adaptive"; DETECTOR.md "The combined test").
# Peers: a rank is slow against its peers when it is at least PEER_MIN slower than
# their leave-one-out median and PEER_Z robust sds of their spread above it (or the
# seed's suspect_ratio, whatever the spread). PEER_MIN scales with suspect_ratio
# (5% at its default 1.10): a user who raises it says peers differ.
PEER_MIN = 0.05
PEER_Z = 5.0
# The peers' spread is a robust sd only with enough of them: the MAD of three
# peers (a 4-rank job) is luck, and a real job's noise then reads as z of 50. Smaller
# groups keep the fixed suspect_ratio (and the change test).
PEER_Z_MIN_GROUP = 8

# History: a CUSUM over the window's log peer ratio against the rank's own confirmed
# (warm-up) value, in units of the rank's own measured noise. It is tuned to a
# change of MIN_SHIFT: each window adds (deviation - MIN_SHIFT/2) / sd; a window is
# bad when the sum reaches CUSUM_H and the window itself is at least MIN_SHIFT/2 slow
# (so the sum's memory never makes a later healthy window bad).
MIN_SHIFT = 0.03
CUSUM_H = 6.0
# Bounds how long a past excursion takes to forget.
CUSUM_CAP = 2 * CUSUM_H
# A rank's noise sd: its own warm-up spread (robust), no less than the median of
# every rank's (five samples can be small by luck), no less than this floor.
SIGMA_FLOOR = 0.002
# Where the noise is large, the shift a window must show (and the CUSUM's
# reference) grows with it: at least CHANGE_Z sds, so the threshold adapts to
# each rank's noise and the baseline's own error never reads as a change.
CHANGE_Z = 3.0

# The job's live noise (adaptive; DETECTOR.md "The combined test"): the robust sd,
# across ranks, of each rank's change in log gap from one window to the next against
# its group's (/sqrt 2: the noise of one window), pooled over the last NOISE_WINDOWS
# windows. It follows noise that every rank shares but that lands on one rank at a
# time and changes during a run (CPU jobs on a shared host: which rank the scheduler
# delays is luck), which a warm-up spread measured once, over five windows, misses.
NOISE_WINDOWS = 8
# Both peer tests need a rank's log peer ratio to be at least NOISE_Z of it.
NOISE_Z = 3.0
# ... or, where higher, that of the last NOISE_RECENT windows alone: the load can rise
# at once, and the longer pool would follow it windows late.
NOISE_RECENT = 3
# While fewer windows are pooled than those (a job's first windows), each estimate is
# widened by (1 + NOISE_SMALL / sqrt(n)) / (1 + NOISE_SMALL / sqrt(n_full)) for the n
# values it has: two standard errors of a MAD's sd (1.16 / sqrt(n) each). A full pool
# is not widened: the gate NOISE_Z was fitted there. On 281 kept real-job runs this
# removed 8 of 50 false flags (most in the first 4 windows) and delayed no flag.
NOISE_SMALL = 2.3

# Island, collective and link kinds (adaptive): the limit is at least SCALAR_Z of the
# scalar's own robust sds above its baseline, in log units. The sd is that of its
# last SCALAR_HISTORY healthy windows (warm-up included), not of the five warm-up
# ones alone: a transfer time in short windows with common stalls has a wide body
# (a window median of 10 steps, a third of them stalled somewhere), and five
# samples can be tight by luck.
SCALAR_Z = 5.0
# ... except the kinds here, whose sd is of value / baseline - 1 and whose limit is
# 1 + SCALAR_Z sd: a bridge exchange is a short transfer (2-3 ms on the real-job grid)
# whose noise adds milliseconds rather than multiplying, so its low windows (0.8-1.1
# ms) read as huge log deviations; their log sd put a 4.5x slower bridge under its
# limit, whose windows then fed the noise: 0 of 8 flagged
# (DETECTOR.md "The combined test", island, collective and link kinds).
SCALAR_LINEAR = frozenset({"link"})
# A scalar whose window went over its limit in the last SCALAR_HISTORY windows has
# shown a tail (a 10-step window whose median landed in stalls): its next excursion
# is bad only from its second window in a row. Such windows come at random, a real
# slowdown is there in every window, so a fault loses one window and a tail needs
# four in a row (or five of six) to reach 3 of 4.
SCALAR_HISTORY = 32
# The sd is widened by (1 + SCALAR_SMALL / sqrt(n)) for the error of an sd from n
# samples ...
SCALAR_SMALL = 1.5
# ... and floored here: a scalar that never moved would otherwise flag on a 1% blip.
SCALAR_SD_FLOOR = 0.005

# Late summaries (DETECTOR.md "Late summaries"): a window scored with ranks missing
# keeps what its missing ranks need to be scored against their own window's peers
# when their summaries come after it (a partitioned node), for LATE_WINDOWS windows:
# as long as the assembly keeps a window open to late summaries.
LATE_WINDOWS = 256
# ... each group's peers as at most LATE_PEERS rows at evenly spaced order statistics
# of its judged gap (every row in smaller groups), each standing for the ranks around
# it: enough for a median's error well under the rules' thresholds, bounded memory.
LATE_PEERS = 128

# A rank bad by the host's evidence (host_lost.host_test: its process measured stopped
# or throttled, and its peers measured waiting for it) in this many windows in a row
# is confirmed without the 3 of 4 that noisy timing needs: the evidence is a
# measurement, 0 on a healthy peer, not a ratio in the job's noise. Two, not one: a
# debugger's attach or one throttled period is not an episode (DETECTOR.md "The
# host's evidence").
MEASURED_FLAG_AFTER = 2
