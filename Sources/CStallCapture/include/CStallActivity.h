#ifndef C_STALL_ACTIVITY_H
#define C_STALL_ACTIVITY_H

// One thread-local pointer for StallDetector.withActivity: the calling thread's
// activity record (owned by Swift). Swift has no thread-local storage of its own;
// `pthread_getspecific` costs a call through the PLT, this a TLS load.

/// The calling thread's record: NULL before its first activity, or the value
/// last set.
void *stallcapture_activity_record(void);

/// Sets the calling thread's record.
void stallcapture_activity_set_record(void *record);

#endif
