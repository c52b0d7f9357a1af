! SPDX-License-Identifier: Apache-2.0
! Part of depot: the memory layer for host, CUDA and HIP tensor data.
! A Fortran program that uses depot through the depot_pool module (ISO_C_BINDING interfaces
! to <depot/pool/c_api.h>) on the host backend: the interfaces match the C functions and
! the statistics types match the C structs (figures checked against each other). Stops
! with code 1 on any failure, naming it.
! The out-of-memory callback, in a module: an internal procedure that reaches its host's
! variables would need a trampoline on an executable stack.
module c_api_program_oom
  use, intrinsic :: iso_c_binding
  implicit none
  integer :: oom_calls = 0
  integer(c_size_t) :: oom_requested = 0
contains
  integer(c_int) function on_oom(message, requested_bytes, attempt, user_data) bind(c)
    type(c_ptr), value :: message
    integer(c_size_t), value :: requested_bytes
    integer(c_int), value :: attempt
    type(c_ptr), value :: user_data
    oom_calls = oom_calls + 1
    oom_requested = requested_bytes
    if (.not. c_associated(message) .or. attempt /= 1 .or. c_associated(user_data)) oom_calls = oom_calls + 100
    on_oom = 0
  end function on_oom
end module c_api_program_oom

program c_api_program_f
  use, intrinsic :: iso_c_binding
  use depot_pool
  use c_api_program_oom
  implicit none
  integer :: failures = 0
  integer(c_int) :: count, st
  type(c_ptr) :: p, q
  integer(c_int8_t), pointer :: bytes(:)
  type(depot_memory_stats) :: s0, s1
  integer(c_size_t) :: length
  character(kind=c_char), target :: small(8)
  character(len=:), allocatable :: msg
  type(c_ptr) :: fp, blocks(4), mapping, received
  type(depot_fixed_pool_stats) :: fs
  integer :: i
  integer(c_int64_t) :: cp
  integer(c_int) :: gpu
  integer(c_size_t) :: hlen
  character(kind=c_char), allocatable, target :: handle(:)

  call expect(depot_device_count(DEPOT_DEVICE_HOST, count) == DEPOT_SUCCESS .and. count == 1, 'device_count')
  call expect(depot_get_memory_stats(DEPOT_DEVICE_HOST, 0, s0) == DEPOT_SUCCESS, 'stats before')

  st = depot_allocate(DEPOT_DEVICE_HOST, 0, 4096_c_size_t, c_null_ptr, p)
  call expect(st == DEPOT_SUCCESS .and. c_associated(p), 'allocate 4096')
  call c_f_pointer(p, bytes, [4096])
  bytes = 7_c_int8_t
  call expect(all(bytes == 7_c_int8_t), 'write the block')
  st = depot_allocate(DEPOT_DEVICE_HOST, 0, 3145728_c_size_t, c_null_ptr, q)
  call expect(st == DEPOT_SUCCESS .and. c_associated(q), 'allocate 3 MiB')

  call expect(depot_get_memory_stats(DEPOT_DEVICE_HOST, 0, s1) == DEPOT_SUCCESS, 'stats after')
  ! the struct's layout: each figure where C put it
  call expect(s1%num_allocations%all%current == s0%num_allocations%all%current + 2, 'two more live blocks')
  call expect(s1%num_allocations%small%current == s0%num_allocations%small%current + 1, 'one small')
  call expect(s1%num_allocations%large%current == s0%num_allocations%large%current + 1, 'one large')
  call expect(s1%allocated_bytes%all%current == s0%allocated_bytes%all%current + 4096 + 3145728, 'allocated bytes')
  call expect(s1%requested_bytes%all%current == s0%requested_bytes%all%current + 4096 + 3145728, 'requested bytes')
  call expect(s1%reserved_bytes%all%current == s1%allocated_bytes%all%current + s1%cached_bytes%all%current, &
              'reserved = allocated + cached')
  call expect(s1%peak_allocated == s1%allocated_bytes%all%peak, 'peak_allocated')
  call expect(s1%fragmentation >= 0.0_c_double .and. s1%fragmentation <= 1.0_c_double, 'fragmentation in [0, 1]')
  call expect(s1%cache_hit_rate >= 0.0_c_double .and. s1%cache_hit_rate <= 1.0_c_double, 'hit rate in [0, 1]')
  call expect(s1%num_ooms == s0%num_ooms, 'no out-of-memory')

  st = depot_memory_summary(DEPOT_DEVICE_HOST, 0, c_null_ptr, 0_c_size_t, length)
  call expect(st == DEPOT_SUCCESS .and. length > 8, 'summary length')
  st = depot_memory_summary(DEPOT_DEVICE_HOST, 0, c_loc(small), 8_c_size_t, length)
  call expect(st == DEPOT_SUCCESS .and. small(8) == c_null_char, 'summary cut short, NUL-terminated')

  call expect(depot_deallocate(DEPOT_DEVICE_HOST, 0, p) == DEPOT_SUCCESS, 'free')
  call expect(depot_deallocate_on(DEPOT_DEVICE_HOST, 0, q, c_null_ptr) == DEPOT_SUCCESS, 'free on a stream')
  ! bad input: a status and this thread's message
  call expect(depot_deallocate(DEPOT_DEVICE_HOST, 0, p) == DEPOT_ERROR_INVALID_ARGUMENT, 'double free refused')
  msg = depot_last_error_message()
  call expect(index(msg, '0x') > 0, 'the message names the pointer: '//msg)
  st = depot_allocate(DEPOT_DEVICE_HOST, 2, 64_c_size_t, c_null_ptr, p)
  call expect(st == DEPOT_ERROR_INVALID_ARGUMENT .and. .not. c_associated(p), 'device 2 refused')
  msg = depot_last_error_message()
  call expect(index(msg, 'valid indices are [0, 1)') > 0, 'the message gives the range: '//msg)
  call expect(depot_allocate(7_c_int, 0, 64_c_size_t, c_null_ptr, p) == DEPOT_ERROR_INVALID_ARGUMENT, 'kind 7')
  call expect(depot_empty_cache(DEPOT_DEVICE_HOST, 0) == DEPOT_SUCCESS, 'empty_cache')
  call expect(depot_reset_peak_stats(DEPOT_DEVICE_HOST, 0) == DEPOT_SUCCESS, 'reset_peak_stats')
  call expect(depot_reset_memory_stats(DEPOT_DEVICE_HOST, 0) == DEPOT_SUCCESS, 'reset_memory_stats')
  call expect(depot_record_stream(DEPOT_DEVICE_HOST, 0, c_loc(small), c_null_ptr) == DEPOT_ERROR_INVALID_ARGUMENT, &
              'record_stream of a foreign pointer')

  ! the out-of-memory callback: a request no machine holds (1 PiB) reaches it once
  oom_calls = 0
  call expect(depot_set_oom_handler(DEPOT_DEVICE_HOST, 0, c_funloc(on_oom), c_null_ptr) == DEPOT_SUCCESS, &
              'set the callback')
  st = depot_allocate(DEPOT_DEVICE_HOST, 0, 1125899906842624_c_size_t, c_null_ptr, p)
  call expect(st == DEPOT_ERROR_OUT_OF_MEMORY .and. oom_calls == 1, 'the callback ran once')
  call expect(oom_requested == 1125899906842624_c_size_t, 'the callback got the request')
  call expect(depot_set_oom_handler(DEPOT_DEVICE_HOST, 0, c_null_funptr, c_null_ptr) == DEPOT_SUCCESS, &
              'remove the callback')
  ! the pinned pool and the snapshot
  call expect(depot_allocate_pinned(DEPOT_DEVICE_HOST, 0, 8192_c_size_t, c_null_ptr, p) == DEPOT_SUCCESS, &
              'pinned allocate')
  call expect(depot_deallocate_pinned(DEPOT_DEVICE_HOST, 0, p) == DEPOT_SUCCESS, 'pinned free')
  call expect(depot_memory_snapshot_json(DEPOT_DEVICE_HOST, 0, c_null_ptr, 0_c_size_t, length) == DEPOT_SUCCESS &
              .and. length > 20, 'snapshot length')

  ! a graph capture's pool (the default stream): its allocations apart until released
  call expect(depot_begin_capture(DEPOT_DEVICE_HOST, 0, c_null_ptr, 0_c_int64_t, cp) == DEPOT_SUCCESS &
              .and. cp /= 0, 'begin_capture')
  call expect(depot_empty_cache(DEPOT_DEVICE_HOST, 0) == DEPOT_ERROR_INVALID_ARGUMENT, 'no release in a capture')
  call expect(depot_end_capture(DEPOT_DEVICE_HOST, 0, c_null_ptr) == DEPOT_SUCCESS, 'end_capture')
  call expect(depot_release_capture_pool(DEPOT_DEVICE_HOST, 0, cp + 5) == DEPOT_ERROR_INVALID_ARGUMENT, &
              'an unknown capture pool refused')
  call expect(depot_release_capture_pool(DEPOT_DEVICE_HOST, 0, cp) == DEPOT_SUCCESS, 'release_capture_pool')

  ! a fixed pool: 4 blocks of 1000 bytes (rounded up to 1024), all used, then one more refused
  call expect(depot_fixed_pool_create(DEPOT_DEVICE_HOST, 0, 4096_c_size_t, 1000_c_size_t, fp) == DEPOT_SUCCESS &
              .and. c_associated(fp), 'fixed pool create')
  do i = 1, 4
    call expect(depot_fixed_pool_allocate(fp, blocks(i)) == DEPOT_SUCCESS, 'fixed pool allocate')
  end do
  call c_f_pointer(blocks(4), bytes, [1024])
  bytes = 9_c_int8_t
  call expect(all(bytes == 9_c_int8_t), 'write a fixed pool block')
  call expect(depot_fixed_pool_allocate(fp, p) == DEPOT_ERROR_OUT_OF_MEMORY .and. .not. c_associated(p), &
              'fixed pool exhausted')
  call expect(depot_fixed_pool_deallocate(fp, blocks(2)) == DEPOT_SUCCESS, 'fixed pool free')
  call expect(depot_fixed_pool_deallocate(fp, blocks(2)) == DEPOT_ERROR_INVALID_ARGUMENT, 'fixed pool double free')
  call expect(depot_fixed_pool_defragment(fp) == DEPOT_SUCCESS, 'fixed pool defragment')
  call expect(depot_fixed_pool_get_stats(fp, fs) == DEPOT_SUCCESS, 'fixed pool stats')
  ! the struct's layout: each figure where C put it
  call expect(fs%pool_size == 4096 .and. fs%block_size == 1024 .and. fs%total_blocks == 4, 'fixed pool sizes')
  call expect(fs%used_blocks == 3 .and. fs%free_blocks == 1 .and. fs%peak_used_blocks == 4, 'fixed pool blocks')
  call expect(fs%hits == 4 .and. fs%misses == 1 .and. abs(fs%hit_rate - 0.8_c_double) < 1e-12_c_double, &
              'fixed pool hit rate')
  ! (fragmentation lies in [0, 1]: at most 0 is exactly 0, without comparing reals for equality)
  call expect(fs%largest_free_run == 1 .and. fs%fragmentation <= 0.0_c_double, 'fixed pool fragmentation')
  call expect(depot_fixed_pool_destroy(fp) == DEPOT_SUCCESS, 'fixed pool destroy')
  call expect(depot_fixed_pool_allocate(fp, p) == DEPOT_ERROR_INVALID_ARGUMENT, 'a destroyed pool refused')

  ! interprocess memory: the host backend says it cannot share; bad text refused
  call expect(depot_allocate(DEPOT_DEVICE_HOST, 0, 4096_c_size_t, c_null_ptr, p) == DEPOT_SUCCESS, 'allocate')
  call expect(depot_ipc_export(DEPOT_DEVICE_HOST, 0, p, c_null_ptr, 0_c_size_t, length) == &
              DEPOT_ERROR_NOT_SUPPORTED, 'no host IPC')
  call expect(depot_deallocate(DEPOT_DEVICE_HOST, 0, p) == DEPOT_SUCCESS, 'free')
  call expect(depot_ipc_open('zz' // c_null_char, mapping, p, length) == DEPOT_ERROR_INVALID_ARGUMENT &
              .and. .not. c_associated(mapping), 'bad handle text refused')
  call expect(depot_ipc_close(c_null_ptr) == DEPOT_SUCCESS, 'close NULL')
  call expect(depot_ipc_receive(-1_c_int, 0_c_int, mapping, p, length) == DEPOT_ERROR_BACKEND &
              .and. .not. c_associated(mapping), 'receive on no socket')
  call expect(depot_ipc_receive_handle(-1_c_int, 0_c_int, received) == DEPOT_ERROR_BACKEND &
              .and. .not. c_associated(received), 'receive a handle on no socket')
  call expect(depot_ipc_forward(-1_c_int, c_null_ptr, -1_c_int) == DEPOT_ERROR_INVALID_ARGUMENT, 'forward NULL')
  call expect(depot_ipc_open_received(c_null_ptr, mapping, p, length) == DEPOT_ERROR_INVALID_ARGUMENT &
              .and. .not. c_associated(mapping), 'open NULL received')
  call expect(depot_ipc_received_free(c_null_ptr) == DEPOT_SUCCESS, 'free NULL received')

  ! The same calls on a GPU, where this build has a GPU backend and the machine a device
  ! (tools/gpu-check runs this program on the GPU machine): the GPU part must say it ran.
  gpu = -1
  if (depot_device_count(DEPOT_DEVICE_CUDA, count) == DEPOT_SUCCESS .and. count > 0) then
    gpu = DEPOT_DEVICE_CUDA
  else if (depot_device_count(DEPOT_DEVICE_HIP, count) == DEPOT_SUCCESS .and. count > 0) then
    gpu = DEPOT_DEVICE_HIP
  end if
  if (gpu >= 0) then
    call expect(depot_get_memory_stats(gpu, 0, s0) == DEPOT_SUCCESS, 'GPU stats before')
    call expect(depot_allocate(gpu, 0, 1048576_c_size_t, c_null_ptr, p) == DEPOT_SUCCESS .and. c_associated(p), &
                'GPU allocate 1 MiB')
    call expect(depot_get_memory_stats(gpu, 0, s1) == DEPOT_SUCCESS, 'GPU stats after')
    call expect(s1%allocated_bytes%all%current == s0%allocated_bytes%all%current + 1048576, 'GPU allocated bytes')
    ! interprocess memory: the handle's text, opened in this process (the block itself)
    call expect(depot_ipc_export(gpu, 0, p, c_null_ptr, 0_c_size_t, hlen) == DEPOT_SUCCESS .and. hlen >= 242, &
                'GPU IPC handle length')
    allocate (handle(hlen + 1))
    call expect(depot_ipc_export(gpu, 0, p, c_loc(handle), hlen, length) == DEPOT_ERROR_INVALID_ARGUMENT, &
                'GPU IPC buffer one short refused')
    call expect(depot_ipc_export(gpu, 0, p, c_loc(handle), hlen + 1, length) == DEPOT_SUCCESS .and. &
                length == hlen, 'GPU IPC export')
    call expect(handle(hlen + 1) == c_null_char, 'GPU IPC handle NUL-terminated')
    call expect(depot_ipc_open(handle, mapping, q, length) == DEPOT_SUCCESS, 'GPU IPC open')
    call expect(c_associated(q, p) .and. length == 1048576, 'GPU IPC: the block itself, its size')
    call expect(depot_ipc_close(mapping) == DEPOT_SUCCESS, 'GPU IPC close')
    call expect(depot_ipc_close(mapping) == DEPOT_ERROR_INVALID_ARGUMENT, 'GPU IPC closed twice refused')
    call expect(depot_deallocate(gpu, 0, p) == DEPOT_SUCCESS, 'GPU free')
    call expect(depot_deallocate(gpu, 0, p) == DEPOT_ERROR_INVALID_ARGUMENT, 'GPU double free refused')
    ! a fixed pool of device memory
    call expect(depot_fixed_pool_create(gpu, 0, 16384_c_size_t, 4096_c_size_t, fp) == DEPOT_SUCCESS, &
                'GPU fixed pool create')
    do i = 1, 4
      call expect(depot_fixed_pool_allocate(fp, blocks(i)) == DEPOT_SUCCESS, 'GPU fixed pool allocate')
    end do
    call expect(depot_fixed_pool_allocate(fp, p) == DEPOT_ERROR_OUT_OF_MEMORY, 'GPU fixed pool exhausted')
    call expect(depot_fixed_pool_get_stats(fp, fs) == DEPOT_SUCCESS .and. fs%used_blocks == 4 .and. &
                fs%misses == 1, 'GPU fixed pool stats')
    call expect(depot_fixed_pool_destroy(fp) == DEPOT_SUCCESS, 'GPU fixed pool destroy')
    print '(a, i0)', 'c_api_program_f: the GPU part ran, device kind ', gpu
  else
    print '(a)', 'c_api_program_f: no GPU backend or device: the GPU part did not run'
  end if

  if (failures /= 0) then
    print '(a, i0, a)', 'c_api_program_f: ', failures, ' failure(s)'
    stop 1
  end if
  print '(a)', 'c_api_program_f: ok'

contains


  subroutine expect(ok, what)
    logical, intent(in) :: ok
    character(len=*), intent(in) :: what
    if (.not. ok) then
      failures = failures + 1
      print '(a, a)', 'c_api_program_f: FAILED ', what
    end if
  end subroutine expect

end program c_api_program_f
