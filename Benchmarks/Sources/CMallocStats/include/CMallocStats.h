#ifndef C_MALLOC_STATS_H
#define C_MALLOC_STATS_H

#include <stddef.h>

/// Bytes currently allocated through malloc (in-use chunks plus mmapped blocks),
/// or 0 where the allocator cannot tell.
size_t cmallocstats_allocated_bytes(void);

#endif
