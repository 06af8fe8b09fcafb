/* pthread_create interposed (dlsym RTLD_NEXT) to count the threads a process creates: include
 * once, in the one file of a test executable that defines main, and read or reset g_creates.
 * Not for ThreadSanitizer builds (its runtime owns pthread_create; tests/meson.build). */
#ifndef SDPA_TESTS_PTHREAD_COUNTER_H
#define SDPA_TESTS_PTHREAD_COUNTER_H

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

static _Atomic long g_creates;

int pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg) {
    typedef int (*real_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
    static real_fn real;
    if (real == NULL) {
        void *sym = dlsym(RTLD_NEXT, "pthread_create");
        memcpy(&real, &sym, sizeof real); /* POSIX: dlsym's result may be used as a function pointer */
    }
    g_creates++;
    return real(t, a, fn, arg);
}

#endif
