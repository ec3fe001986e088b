#include "CStallActivity.h"

// Plain C11 thread-local storage, on every platform.
static _Thread_local void *activity_record = 0;

void *stallcapture_activity_record(void) { return activity_record; }

void stallcapture_activity_set_record(void *record) { activity_record = record; }
