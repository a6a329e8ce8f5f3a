/* Replays on the default pool a sequence the real driver ran (tests/fakegpu/pool-h200: a table
 * scripts/pool_model.py made from a recording on an H200), argv[1], with release threshold
 * argv[2]: each line is "a SIZE" (cudaMallocAsync), "f INDEX" (cudaFreeAsync of the INDEXth
 * allocation), "s 0" (cudaDeviceSynchronize) or "t 0" (cudaMemPoolTrimTo 0), then the card's
 * reserved and used bytes after it and the model's reserved bytes. After every op the pool's
 * UsedMemCurrent must be the card's and its ReservedMemCurrent the model's; the last line counts
 * the ops where reserved equals the card's too. Built with -DCUDA_MAJOR=13 or 12. */
#include <stdio.h>
#include <stdlib.h>

typedef int cudaError_t;
typedef void *cudaMemPool_t;
cudaError_t cudaMallocAsync(void **p, size_t size, void *stream);
cudaError_t cudaFreeAsync(void *p, void *stream);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device);
cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep);
cudaError_t cudaMemPoolSetAttribute(cudaMemPool_t pool, int attr, void *value);
cudaError_t cudaMemPoolGetAttribute(cudaMemPool_t pool, int attr, void *value);
enum { RELEASE_THRESHOLD = 4, RESERVED_CURRENT = 5, RESERVED_HIGH = 6, USED_CURRENT = 7,
       USED_HIGH = 8 };

static unsigned long long attribute(cudaMemPool_t pool, int attr)
{
    unsigned long long value = 0;
    if (cudaMemPoolGetAttribute(pool, attr, &value))
        printf("attribute %d failed\n", attr);
    return value;
}

int main(int argc, char **argv)
{
    FILE *table = argc == 3 ? fopen(argv[1], "r") : NULL;
    if (!table) {
        printf("usage: pool_replay TABLE THRESHOLD\n");
        return 2;
    }
    cudaMemPool_t pool;
    unsigned long long threshold = strtoull(argv[2], NULL, 10);
    if (cudaDeviceGetDefaultMemPool(&pool, 0) ||
        cudaMemPoolSetAttribute(pool, RELEASE_THRESHOLD, &threshold)) {
        printf("no default pool\n");
        return 1;
    }
    static void *allocs[4096];
    int count = 0, ops = 0, used_wrong = 0, reserved_wrong = 0, reserved_real = 0;
    unsigned long long real_high = 0, model_high = 0;
    char op;
    unsigned long long arg, real_reserved, real_used, model_reserved;
    while (fscanf(table, " %c %llu %llu %llu %llu", &op, &arg, &real_reserved, &real_used,
                  &model_reserved) == 5) {
        cudaError_t rc = 0;
        if (op == 'a' && count < 4096)
            rc = cudaMallocAsync(&allocs[count++], arg, NULL);
        else if (op == 'f' && arg < (unsigned long long)count)
            rc = cudaFreeAsync(allocs[arg], NULL);
        else if (op == 's')
            rc = cudaDeviceSynchronize();
        else if (op == 't')
            rc = cudaMemPoolTrimTo(pool, 0);
        else
            rc = -1;
        unsigned long long reserved = attribute(pool, RESERVED_CURRENT);
        unsigned long long used = attribute(pool, USED_CURRENT);
        if (rc || used != real_used || reserved != model_reserved) {
            if (used != real_used)
                used_wrong++;
            if (reserved != model_reserved)
                reserved_wrong++;
            if (used_wrong + reserved_wrong < 5)
                printf("op %d %c %llu rc=%d used %llu (card %llu) reserved %llu (model %llu)\n",
                       ops, op, arg, rc, used, real_used, reserved, model_reserved);
        }
        reserved_real += reserved == real_reserved;
        real_high = real_reserved > real_high ? real_reserved : real_high;
        model_high = model_reserved > model_high ? model_reserved : model_high;
        ops++;
    }
    printf("ops=%d used_wrong=%d reserved_wrong=%d reserved_as_card=%d high=%llu card_high=%llu "
           "used_high=%llu\n",
           ops, used_wrong, reserved_wrong, reserved_real, attribute(pool, RESERVED_HIGH),
           real_high, attribute(pool, USED_HIGH));
    return used_wrong || reserved_wrong || attribute(pool, RESERVED_HIGH) != model_high;
}
