/* NVTX domains through a real NVTX library: nvtx_domains LIBRARY dlopens LIBRARY (NVIDIA's
 * libnvToolsExt.so.1, which loads NVTX_INJECTION64_PATH at the first call) and makes named
 * domain calls mixed with default-domain ones, printing each return value as `name value`.
 * For tests/tests/nvtx.rs; no GPU.
 */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* nvtxEventAttributes_v2 */
struct attributes {
    uint16_t version, size;
    uint32_t category;
    int32_t color_type;
    uint32_t color;
    int32_t payload_type, reserved0;
    uint64_t payload;
    int32_t message_type; /* 1 ASCII, 3 registered */
    const void *message;
};

static void *library;

static void *need(const char *name) {
    void *found = dlsym(library, name);
    if (!found) {
        fprintf(stderr, "nvtx_domains: %s not in the library\n", name);
        exit(2);
    }
    return found;
}

static struct attributes ascii(const char *text) {
    struct attributes a = {2, sizeof(struct attributes), 0, 0, 0, 0, 0, 0, 1, text};
    return a;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: nvtx_domains LIBRARY\n");
        return 2;
    }
    library = dlopen(argv[1], RTLD_NOW);
    if (!library) {
        fprintf(stderr, "nvtx_domains: %s\n", dlerror());
        return 2;
    }
    void *(*create)(const char *) = need("nvtxDomainCreateA");
    void (*destroy)(void *) = need("nvtxDomainDestroy");
    int (*push_ex)(void *, const struct attributes *) = need("nvtxDomainRangePushEx");
    int (*pop)(void *) = need("nvtxDomainRangePop");
    void (*mark_ex)(void *, const struct attributes *) = need("nvtxDomainMarkEx");
    uint64_t (*start_ex)(void *, const struct attributes *) = need("nvtxDomainRangeStartEx");
    void (*end)(void *, uint64_t) = need("nvtxDomainRangeEnd");
    void *(*register_a)(void *, const char *) = need("nvtxDomainRegisterStringA");
    int (*core_push)(const char *) = need("nvtxRangePushA");
    int (*core_pop)(void) = need("nvtxRangePop");

    void *test = create("vramshim.test");
    void *other = create("other");
    printf("domains %d\n", test != NULL && other != NULL && test != other);
    struct attributes a = ascii("outer");
    printf("push outer %d\n", push_ex(test, &a));
    printf("push core %d\n", core_push("core"));
    a = ascii("inner");
    printf("push inner %d\n", push_ex(test, &a));
    a = ascii("checkpoint");
    mark_ex(other, &a);
    printf("pop inner %d\n", pop(test));
    printf("pop core %d\n", core_pop());
    printf("pop outer %d\n", pop(test));
    printf("pop nothing %d\n", pop(test));
    struct attributes registered = {2, sizeof(struct attributes), 0, 0, 0, 0, 0, 0, 3,
                                    register_a(test, "registered step")};
    mark_ex(test, &registered);
    a = ascii("load");
    end(other, start_ex(other, &a));
    a = ascii("global");
    mark_ex(NULL, &a);
    destroy(test);
    printf("done\n");
    return 0;
}
