#define _GNU_SOURCE
#include "CStallProcess.h"

#if defined(__linux__)
#include <dlfcn.h>
#include <link.h>
#include <string.h>
#include <sys/auxv.h>

// Exported by libdispatch; the Swift overlay does not import it.
extern void *dispatch_get_current_queue(void);

extern const char *dispatch_queue_get_label(void *queue);

uintptr_t stallcapture_current_queue(void) { return (uintptr_t)dispatch_get_current_queue(); }

uintptr_t stallcapture_current_serial_queue(void) {
    void *queue = dispatch_get_current_queue();
    const char *label = queue == NULL ? NULL : dispatch_queue_get_label(queue);
    // libdispatch's global (root) queues: "com.apple.root.default-qos", ….
    if (queue == NULL || (label != NULL && strncmp(label, "com.apple.root.", 15) == 0)) return 0;
    return (uintptr_t)queue;
}

uintptr_t stallcapture_auxiliary_value(unsigned long type) { return (uintptr_t)getauxval(type); }

int stallcapture_image_of(uintptr_t address, char *path, size_t size, uintptr_t *base) {
    Dl_info info;
    if (size == 0 || dladdr((void *)address, &info) == 0 || info.dli_fname == NULL) return 0;
    strncpy(path, info.dli_fname, size - 1);
    path[size - 1] = 0;
    *base = (uintptr_t)info.dli_fbase;
    return 1;
}

typedef struct {
    uintptr_t address;
    uintptr_t start;
    size_t size;
} tls_query;

static int find_tls_block(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    tls_query *query = data;
    int holds = 0;
    size_t tls_size = 0;
    for (int index = 0; index < info->dlpi_phnum; index++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[index];
        uintptr_t start = info->dlpi_addr + header->p_vaddr;
        if (header->p_type == PT_LOAD && query->address - start < header->p_memsz) holds = 1;
        if (header->p_type == PT_TLS) tls_size = header->p_memsz;
    }
    if (!holds) return 0;
    query->start = (uintptr_t)info->dlpi_tls_data;
    query->size = query->start == 0 ? 0 : tls_size;
    return 1;
}

int stallcapture_tls_block_of(uintptr_t address, uintptr_t *start, size_t *size) {
    tls_query query = {address, 0, 0};
    if (dl_iterate_phdr(find_tls_block, &query) == 0 || query.size == 0) return 0;
    *start = query.start;
    *size = query.size;
    return 1;
}

int stallcapture_exported_name(uintptr_t address, char *name, size_t size) {
    Dl_info info;
    if (size == 0 || dladdr((void *)address, &info) == 0 || info.dli_sname == NULL) return 0;
    if ((uintptr_t)info.dli_saddr != address) return 0;
    strncpy(name, info.dli_sname, size - 1);
    name[size - 1] = 0;
    return 1;
}
#else
uintptr_t stallcapture_current_queue(void) { return 0; }

uintptr_t stallcapture_current_serial_queue(void) { return 0; }

uintptr_t stallcapture_auxiliary_value(unsigned long type) {
    (void)type;
    return 0;
}

int stallcapture_image_of(uintptr_t address, char *path, size_t size, uintptr_t *base) {
    (void)address; (void)path; (void)size; (void)base;
    return 0;
}

int stallcapture_exported_name(uintptr_t address, char *name, size_t size) {
    (void)address; (void)name; (void)size;
    return 0;
}

int stallcapture_tls_block_of(uintptr_t address, uintptr_t *start, size_t *size) {
    (void)address; (void)start; (void)size;
    return 0;
}
#endif
