/* SPDX-License-Identifier: Apache-2.0 */
/* Part of depot: the memory layer for host, CUDA and HIP tensor data. */
/* A C program (compiled as C11, -Wpedantic) that uses depot through <depot/pool/c_api.h> on
 * the host backend: the header is valid C and the library links from C. Exits 1 on any
 * failure, naming it. */
#include <depot/pool/c_api.h>

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define EXPECT(cond)                                                        \
  do {                                                                      \
    if (!(cond)) {                                                          \
      fprintf(stderr, "c_api_program: FAILED %s (line %d): last error: %s\n", #cond, __LINE__, \
              depot_last_error());                                          \
      ++failures;                                                           \
    }                                                                       \
  } while (0)

int main(void)
{
  int count = 0;
  EXPECT(depot_device_count(DEPOT_DEVICE_HOST, &count) == DEPOT_SUCCESS && count == 1);

  unsigned char* p = NULL;
  EXPECT(depot_allocate(DEPOT_DEVICE_HOST, 0, 4096, NULL, (void**)&p) == DEPOT_SUCCESS && p != NULL);
  if (p != NULL) {
    memset(p, 7, 4096);
    EXPECT(p[4095] == 7);
  }
  depot_memory_stats s;
  EXPECT(depot_get_memory_stats(DEPOT_DEVICE_HOST, 0, &s) == DEPOT_SUCCESS);
  EXPECT(s.allocated_bytes.all.current >= 4096 && s.num_allocations.all.current >= 1);
  EXPECT(s.reserved_bytes.all.current >= s.allocated_bytes.all.current);

  size_t length = 0;
  EXPECT(depot_memory_summary(DEPOT_DEVICE_HOST, 0, NULL, 0, &length) == DEPOT_SUCCESS && length > 0);

  EXPECT(depot_deallocate(DEPOT_DEVICE_HOST, 0, p) == DEPOT_SUCCESS);
  EXPECT(depot_deallocate(DEPOT_DEVICE_HOST, 0, p) == DEPOT_ERROR_INVALID_ARGUMENT); /* double free */
  EXPECT(strstr(depot_last_error(), "0x") != NULL);
  EXPECT(depot_allocate(DEPOT_DEVICE_HOST, 3, 64, NULL, (void**)&p) == DEPOT_ERROR_INVALID_ARGUMENT);
  EXPECT(p == NULL);
  EXPECT(strcmp(depot_status_name(DEPOT_ERROR_OUT_OF_MEMORY), "DEPOT_ERROR_OUT_OF_MEMORY") == 0);
  EXPECT(depot_empty_cache(DEPOT_DEVICE_HOST, 0) == DEPOT_SUCCESS);

  /* a fixed pool: its blocks, exhaustion, statistics, a destroyed handle refused */
  depot_fixed_pool* fp = NULL;
  void* blocks[2] = {NULL, NULL};
  void* more = NULL;
  depot_fixed_pool_stats fs;
  EXPECT(depot_fixed_pool_create(DEPOT_DEVICE_HOST, 0, 2 * 4096, 4096, &fp) == DEPOT_SUCCESS && fp != NULL);
  EXPECT(depot_fixed_pool_allocate(fp, &blocks[0]) == DEPOT_SUCCESS && blocks[0] != NULL);
  EXPECT(depot_fixed_pool_allocate(fp, &blocks[1]) == DEPOT_SUCCESS && blocks[1] != NULL);
  if (blocks[1] != NULL) memset(blocks[1], 3, 4096);
  EXPECT(depot_fixed_pool_allocate(fp, &more) == DEPOT_ERROR_OUT_OF_MEMORY && more == NULL);
  EXPECT(depot_fixed_pool_get_stats(fp, &fs) == DEPOT_SUCCESS);
  EXPECT(fs.total_blocks == 2 && fs.used_blocks == 2 && fs.hits == 2 && fs.misses == 1);
  EXPECT(depot_fixed_pool_deallocate(fp, blocks[0]) == DEPOT_SUCCESS);
  EXPECT(depot_fixed_pool_deallocate(fp, blocks[0]) == DEPOT_ERROR_INVALID_ARGUMENT);
  EXPECT(depot_fixed_pool_destroy(fp) == DEPOT_SUCCESS);
  EXPECT(depot_fixed_pool_defragment(fp) == DEPOT_ERROR_INVALID_ARGUMENT);
  EXPECT(strstr(depot_last_error(), "not a live fixed pool") != NULL);

  /* interprocess memory: the host backend says it cannot share; bad text and handles refused */
  {
    char text[300] = "x";
    size_t text_length = 0;
    depot_ipc_mapping* mapping = NULL;
    void* q = NULL;
    size_t bytes = 0;
    EXPECT(depot_allocate(DEPOT_DEVICE_HOST, 0, 4096, NULL, &q) == DEPOT_SUCCESS);
    EXPECT(depot_ipc_export(DEPOT_DEVICE_HOST, 0, q, text, sizeof text, &text_length) == DEPOT_ERROR_NOT_SUPPORTED);
    EXPECT(text[0] == '\0');
    EXPECT(depot_ipc_send(-1, DEPOT_DEVICE_HOST, 0, q, -1) == DEPOT_ERROR_NOT_SUPPORTED); /* nor sent */
    EXPECT(depot_deallocate(DEPOT_DEVICE_HOST, 0, q) == DEPOT_SUCCESS);
    EXPECT(depot_ipc_open("zz", &mapping, &q, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT && mapping == NULL);
    EXPECT(depot_ipc_close(NULL) == DEPOT_SUCCESS);
    /* the socket calls: nothing to receive on a bad socket (the failing call named) */
    EXPECT(depot_ipc_receive(-1, 0, &mapping, &q, &bytes) == DEPOT_ERROR_BACKEND && mapping == NULL && q == NULL);
    EXPECT(strstr(depot_last_error(), "ipc_receive") != NULL);
    /* a broker's calls: nothing held on a refusal */
    depot_ipc_received* received = (depot_ipc_received*)&bytes;
    EXPECT(depot_ipc_receive_handle(-1, 0, &received) == DEPOT_ERROR_BACKEND && received == NULL);
    EXPECT(depot_ipc_forward(-1, NULL, -1) == DEPOT_ERROR_INVALID_ARGUMENT);
    EXPECT(strstr(depot_last_error(), "received is NULL") != NULL);
    EXPECT(depot_ipc_open_received(NULL, &mapping, &q, &bytes) == DEPOT_ERROR_INVALID_ARGUMENT && mapping == NULL);
    EXPECT(depot_ipc_received_free(NULL) == DEPOT_SUCCESS);
    EXPECT(depot_ipc_close((depot_ipc_mapping*)fp) == DEPOT_ERROR_INVALID_ARGUMENT); /* not a mapping */
    EXPECT(strstr(depot_last_error(), "not an open IPC mapping") != NULL);
  }

  if (failures == 0) printf("c_api_program: ok\n");
  return failures == 0 ? 0 : 1;
}
