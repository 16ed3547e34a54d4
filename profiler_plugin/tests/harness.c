/*
 * harness.c: multi-threaded self-checking test of the Artemis profiler plugin.
 *
 * Built together with abi.c, core.c and ring.c under ASan+UBSan and under TSan
 * (see the Makefile). This file runs the tests in order; harness.h says which
 * file holds each group, harness_fixture.c what they share. User-like threads
 * issue the NCCL 2.28+ event sequence for collectives and p2p ops; proxy-like
 * threads issue KernelCh events for them (channels of one op go to different
 * threads, before or after the Coll stop); a reader thread reads the rings
 * concurrently with the seqlock protocol. Every field of a record is derived
 * from (rank, coll_seq), so any torn record that the reader accepted would
 * fail the check.
 *
 * Exit status: 0 when every check passed, 1 otherwise.
 */
#include "harness.h"

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    uint64_t scale = argc > 1 ? strtoull(argv[1], NULL, 10) : 20000;
    snprintf(g_root, sizeof g_root, "/tmp/artemis-harness-XXXXXX");
    if (!mkdtemp(g_root)) {
        perror("mkdtemp");
        return 1;
    }
    printf("artemis plugin harness (root %s, %llu ops per comm)\n", g_root, (unsigned long long)scale);

    /* the tests read rings after finalize: kept (test_retire checks removal) */
    setenv("ARTEMIS_KEEP_RINGS", "1", 1);
    test_retire();
    printf("  ring lifetime done\n");

    test_failures();
    printf("  failure paths done\n");
    test_no_device_events();
    printf("  ops without device events done\n");
    test_concurrent_init();
    printf("  concurrent init done\n");
    test_lap_in_flight();
    printf("  lapping an in-flight record done\n");
    test_kfin_race();
    test_two_starters();
    test_lanes();
    test_switch_rounds();
    test_switch_in_start();
    test_switch_mb_fail();
    test_host_clock(1);
    test_host_clock(0);
    test_env_sidecar();
    printf("  env sidecar done\n");

    clear_env();
    int one6[] = {6};
    run_scenario("one", 1, one6, scale, 3, NULL, 1, 0);
    int multi[] = {6, 7, 6};
    run_scenario("multi", 3, multi, scale, 3, NULL, 1, 0);
    int host5[] = {5, 4};
    run_scenario("host", 2, host5, scale / 2, 2, "1024", 0, 0);
    clear_env();
    int tiny[] = {7, 6};
    run_scenario("tiny", 2, tiny, scale / 2, 3, "4", 1, 1);

    int f = atomic_load(&failures);
    if (f) printf("FAILED: %d check(s)\n", f);
    else printf("PASSED\n");
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_root);
    if (system(cmd) != 0) fprintf(stderr, "cleanup of %s failed\n", g_root);
    return f ? 1 : 0;
}
