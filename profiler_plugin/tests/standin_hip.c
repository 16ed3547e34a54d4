/*
 * standin_hip.c: the two HIP runtime entry points the plugin looks up, for the
 * stand-in RCCL (build/standin/libamdhip64.so). The current device is
 * ARTEMIS_STANDIN_HIP_DEVICE (0), its wall-clock rate in kHz
 * ARTEMIS_STANDIN_HIP_WALLCLOCK_KHZ_<device> (100000); "0" makes the
 * attribute query fail. 10017 is hipDeviceAttributeWallClockRate.
 */
#include <stdio.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default")))

EXPORT int hipGetDevice(int *device) {
    const char *v = getenv("ARTEMIS_STANDIN_HIP_DEVICE");
    *device = v && *v ? atoi(v) : 0;
    return 0;
}

EXPORT int hipDeviceGetAttribute(int *value, int attr, int device) {
    if (attr != 10017) return 1; /* hipErrorInvalidValue */
    char name[64];
    snprintf(name, sizeof name, "ARTEMIS_STANDIN_HIP_WALLCLOCK_KHZ_%d", device);
    const char *v = getenv(name);
    int khz = v && *v ? atoi(v) : 100000;
    if (khz <= 0) return 1;
    *value = khz;
    return 0;
}
