#ifndef C_STALL_PROCESS_H
#define C_STALL_PROCESS_H

#include <stddef.h>
#include <stdint.h>

// Facts about the process that Swift's C library overlay does not import.

/// The dispatch queue whose job the calling thread is running: the address of
/// the queue object libdispatch keeps in the thread's state while it drains that
/// queue (a root queue's address outside any job; 0 where there is no
/// libdispatch to ask). The Swift overlay hides `dispatch_get_current_queue`;
/// the address is only compared, never dereferenced.
uintptr_t stallcapture_current_queue(void);

/// The serial queue whose job the calling thread is running, or 0 when it runs
/// none (outside any job, or a job of a global queue: their workers are shared,
/// so the address tells nothing about which thread runs whose job).
uintptr_t stallcapture_current_serial_queue(void);

/// An entry of the auxiliary vector (`getauxval`: `AT_PHDR` 3, `AT_SYSINFO_EHDR`
/// 33); 0 when absent or not on Linux.
uintptr_t stallcapture_auxiliary_value(unsigned long type);

/// The file and load address of the loaded image that holds `address`
/// (`dladdr`): the path is copied into `path` (at most `size` bytes, ended by a
/// zero). Returns 1 when an image holds it, else 0.
int stallcapture_image_of(uintptr_t address, char *path, size_t size, uintptr_t *base);

/// The exported symbol that starts exactly at `address` (`dladdr`), copied
/// into `name` (NUL-terminated, at most `size` bytes); 1 when found, else 0
/// (0 everywhere but Linux).
int stallcapture_exported_name(uintptr_t address, char *name, size_t size);

/// The calling thread's thread-local block of the loaded image that holds
/// `address` (`dl_iterate_phdr`'s `dlpi_tls_data` and the image's `PT_TLS`
/// size): 1 when it has one and it is allocated for this thread, else 0.
int stallcapture_tls_block_of(uintptr_t address, uintptr_t *start, size_t *size);

#endif
