! SPDX-License-Identifier: Apache-2.0
! Part of depot: the memory layer for host, CUDA and HIP tensor data.
! Fortran interfaces (ISO_C_BINDING) to depot's C interface, <depot/pool/c_api.h>: the same
! functions, constants and statistics types, and depot_last_error_message() returning the
! calling thread's last error as a Fortran string. Compile this file with your code (a .mod
! file is specific to its compiler) and link libdepot. Thread-safety, stream and ownership
! rules are the C interface's: every function returns a status (DEPOT_SUCCESS or an error)
! and never unwinds; streams are the backend's handles as type(c_ptr) (c_null_ptr: the
! default stream); memory from depot_allocate is the caller's until depot_deallocate.
module depot_pool
  use, intrinsic :: iso_c_binding, only: c_int, c_int64_t, c_double, c_size_t, c_ptr, c_funptr, c_char, &
                                         c_null_char, c_f_pointer, c_associated
  implicit none
  private

  ! depot_device_kind
  integer(c_int), parameter, public :: DEPOT_DEVICE_HOST = 0, DEPOT_DEVICE_CUDA = 1, DEPOT_DEVICE_HIP = 2
  ! depot_status
  integer(c_int), parameter, public :: DEPOT_SUCCESS = 0, DEPOT_ERROR_INVALID_ARGUMENT = 1, &
                                       DEPOT_ERROR_OUT_OF_MEMORY = 2, DEPOT_ERROR_NOT_SUPPORTED = 3, &
                                       DEPOT_ERROR_BACKEND = 4, DEPOT_ERROR_INTERNAL = 5

  type, bind(c), public :: depot_stat
    integer(c_int64_t) :: current, peak, allocated, freed
  end type depot_stat

  type, bind(c), public :: depot_stat_array
    type(depot_stat) :: all, small, large
  end type depot_stat_array

  type, bind(c), public :: depot_memory_stats
    type(depot_stat_array) :: allocated_bytes, requested_bytes, reserved_bytes, cached_bytes, &
                              active_bytes, inactive_split_bytes, num_allocations, num_segments
    integer(c_int64_t) :: num_cache_hits, num_cache_misses
    real(c_double) :: cache_hit_rate
    integer(c_int64_t) :: peak_allocated, peak_cached, num_alloc_retries, num_ooms, largest_free_block
    real(c_double) :: fragmentation
    integer(c_int64_t) :: num_segments_moved, num_move_events, num_move_syncs
  end type depot_memory_stats

  ! depot_fixed_pool_stats (a fixed pool's handle is a type(c_ptr))
  type, bind(c), public :: depot_fixed_pool_stats
    integer(c_size_t) :: pool_size, block_size, total_blocks, used_blocks, free_blocks, peak_used_blocks
    integer(c_int64_t) :: hits, misses
    real(c_double) :: hit_rate
    integer(c_size_t) :: largest_free_run
    real(c_double) :: fragmentation
  end type depot_fixed_pool_stats

  public :: depot_begin_capture, depot_end_capture, depot_release_capture_pool
  public :: depot_ipc_export, depot_ipc_open, depot_ipc_close, depot_ipc_send, depot_ipc_receive, &
            depot_ipc_receive_handle, depot_ipc_forward, depot_ipc_open_received, depot_ipc_received_free
  public :: depot_fixed_pool_create, depot_fixed_pool_destroy, depot_fixed_pool_allocate, &
            depot_fixed_pool_deallocate, depot_fixed_pool_defragment, depot_fixed_pool_get_stats, &
            depot_fixed_pool_set_oom_handler
  public :: depot_device_count, depot_allocate, depot_deallocate, depot_deallocate_on, &
            depot_record_stream, depot_empty_cache, depot_reset_peak_stats, depot_reset_memory_stats, &
            depot_get_memory_stats, depot_memory_summary, depot_memory_snapshot_json, &
            depot_set_trace_capacity, depot_trace_json, depot_set_oom_handler, depot_allocate_pinned, &
            depot_deallocate_pinned, depot_last_error, depot_status_name, depot_last_error_message

  interface
    integer(c_int) function depot_device_count(kind, count) bind(c, name='depot_device_count')
      import :: c_int
      integer(c_int), value :: kind
      integer(c_int), intent(out) :: count
    end function depot_device_count

    integer(c_int) function depot_allocate(kind, device, bytes, stream, ptr) bind(c, name='depot_allocate')
      import :: c_int, c_size_t, c_ptr
      integer(c_int), value :: kind, device
      integer(c_size_t), value :: bytes
      type(c_ptr), value :: stream
      type(c_ptr), intent(out) :: ptr
    end function depot_allocate

    integer(c_int) function depot_deallocate(kind, device, ptr) bind(c, name='depot_deallocate')
      import :: c_int, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: ptr
    end function depot_deallocate

    integer(c_int) function depot_deallocate_on(kind, device, ptr, stream) bind(c, name='depot_deallocate_on')
      import :: c_int, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: ptr, stream
    end function depot_deallocate_on

    integer(c_int) function depot_record_stream(kind, device, ptr, stream) bind(c, name='depot_record_stream')
      import :: c_int, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: ptr, stream
    end function depot_record_stream

    integer(c_int) function depot_empty_cache(kind, device) bind(c, name='depot_empty_cache')
      import :: c_int
      integer(c_int), value :: kind, device
    end function depot_empty_cache

    integer(c_int) function depot_reset_peak_stats(kind, device) bind(c, name='depot_reset_peak_stats')
      import :: c_int
      integer(c_int), value :: kind, device
    end function depot_reset_peak_stats

    integer(c_int) function depot_reset_memory_stats(kind, device) bind(c, name='depot_reset_memory_stats')
      import :: c_int
      integer(c_int), value :: kind, device
    end function depot_reset_memory_stats

    integer(c_int) function depot_get_memory_stats(kind, device, stats) bind(c, name='depot_get_memory_stats')
      import :: c_int, depot_memory_stats
      integer(c_int), value :: kind, device
      type(depot_memory_stats), intent(out) :: stats
    end function depot_get_memory_stats

    ! buffer: a character(kind=c_char) array of `size` elements (or c_null_ptr with size 0)
    integer(c_int) function depot_memory_summary(kind, device, buffer, size, length) &
        bind(c, name='depot_memory_summary')
      import :: c_int, c_size_t, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: buffer
      integer(c_size_t), value :: size
      integer(c_size_t), intent(out) :: length
    end function depot_memory_summary

    ! buffer and length: as depot_memory_summary
    integer(c_int) function depot_memory_snapshot_json(kind, device, buffer, size, length) &
        bind(c, name='depot_memory_snapshot_json')
      import :: c_int, c_size_t, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: buffer
      integer(c_size_t), value :: size
      integer(c_size_t), intent(out) :: length
    end function depot_memory_snapshot_json

    integer(c_int) function depot_set_trace_capacity(kind, device, events) bind(c, name='depot_set_trace_capacity')
      import :: c_int, c_size_t
      integer(c_int), value :: kind, device
      integer(c_size_t), value :: events
    end function depot_set_trace_capacity

    integer(c_int) function depot_trace_json(kind, device, buffer, size, length) bind(c, name='depot_trace_json')
      import :: c_int, c_size_t, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: buffer
      integer(c_size_t), value :: size
      integer(c_size_t), intent(out) :: length
    end function depot_trace_json

    ! callback: c_funloc of a bind(c) function
    !   integer(c_int) function f(message, requested_bytes, attempt, user_data) bind(c)
    !     type(c_ptr), value :: message            ! a NUL-terminated C string
    !     integer(c_size_t), value :: requested_bytes
    !     integer(c_int), value :: attempt         ! (C: unsigned)
    !     type(c_ptr), value :: user_data
    ! (nonzero: try again); c_null_funptr removes it.
    integer(c_int) function depot_set_oom_handler(kind, device, callback, user_data) &
        bind(c, name='depot_set_oom_handler')
      import :: c_int, c_ptr, c_funptr
      integer(c_int), value :: kind, device
      type(c_funptr), value :: callback
      type(c_ptr), value :: user_data
    end function depot_set_oom_handler

    integer(c_int) function depot_allocate_pinned(kind, device, bytes, stream, ptr) bind(c, name='depot_allocate_pinned')
      import :: c_int, c_size_t, c_ptr
      integer(c_int), value :: kind, device
      integer(c_size_t), value :: bytes
      type(c_ptr), value :: stream
      type(c_ptr), intent(out) :: ptr
    end function depot_allocate_pinned

    integer(c_int) function depot_deallocate_pinned(kind, device, ptr) bind(c, name='depot_deallocate_pinned')
      import :: c_int, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: ptr
    end function depot_deallocate_pinned

    ! pool, pool_out: a capture pool's id (C: uint64_t; 0 asks for a new pool)
    integer(c_int) function depot_begin_capture(kind, device, stream, pool, pool_out) &
        bind(c, name='depot_begin_capture')
      import :: c_int, c_int64_t, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: stream
      integer(c_int64_t), value :: pool
      integer(c_int64_t), intent(out) :: pool_out
    end function depot_begin_capture

    integer(c_int) function depot_end_capture(kind, device, stream) bind(c, name='depot_end_capture')
      import :: c_int, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: stream
    end function depot_end_capture

    integer(c_int) function depot_release_capture_pool(kind, device, pool) bind(c, name='depot_release_capture_pool')
      import :: c_int, c_int64_t
      integer(c_int), value :: kind, device
      integer(c_int64_t), value :: pool
    end function depot_release_capture_pool

    integer(c_int) function depot_fixed_pool_create(kind, device, pool_size, block_size, pool) &
        bind(c, name='depot_fixed_pool_create')
      import :: c_int, c_size_t, c_ptr
      integer(c_int), value :: kind, device
      integer(c_size_t), value :: pool_size, block_size
      type(c_ptr), intent(out) :: pool
    end function depot_fixed_pool_create

    integer(c_int) function depot_fixed_pool_destroy(pool) bind(c, name='depot_fixed_pool_destroy')
      import :: c_int, c_ptr
      type(c_ptr), value :: pool
    end function depot_fixed_pool_destroy

    integer(c_int) function depot_fixed_pool_allocate(pool, ptr) bind(c, name='depot_fixed_pool_allocate')
      import :: c_int, c_ptr
      type(c_ptr), value :: pool
      type(c_ptr), intent(out) :: ptr
    end function depot_fixed_pool_allocate

    integer(c_int) function depot_fixed_pool_deallocate(pool, ptr) bind(c, name='depot_fixed_pool_deallocate')
      import :: c_int, c_ptr
      type(c_ptr), value :: pool, ptr
    end function depot_fixed_pool_deallocate

    integer(c_int) function depot_fixed_pool_defragment(pool) bind(c, name='depot_fixed_pool_defragment')
      import :: c_int, c_ptr
      type(c_ptr), value :: pool
    end function depot_fixed_pool_defragment

    integer(c_int) function depot_fixed_pool_get_stats(pool, stats) bind(c, name='depot_fixed_pool_get_stats')
      import :: c_int, c_ptr, depot_fixed_pool_stats
      type(c_ptr), value :: pool
      type(depot_fixed_pool_stats), intent(out) :: stats
    end function depot_fixed_pool_get_stats

    ! callback: as depot_set_oom_handler's
    integer(c_int) function depot_fixed_pool_set_oom_handler(pool, callback, user_data) &
        bind(c, name='depot_fixed_pool_set_oom_handler')
      import :: c_int, c_ptr, c_funptr
      type(c_ptr), value :: pool
      type(c_funptr), value :: callback
      type(c_ptr), value :: user_data
    end function depot_fixed_pool_set_oom_handler

    ! buffer, size and length: as depot_memory_summary, but a buffer too small is refused
    integer(c_int) function depot_ipc_export(kind, device, ptr, buffer, size, length) &
        bind(c, name='depot_ipc_export')
      import :: c_int, c_size_t, c_ptr
      integer(c_int), value :: kind, device
      type(c_ptr), value :: ptr, buffer
      integer(c_size_t), value :: size
      integer(c_size_t), intent(out) :: length
    end function depot_ipc_export

    ! handle: depot_ipc_export's text, NUL-terminated (trim(text) // c_null_char)
    integer(c_int) function depot_ipc_open(handle, mapping, ptr, bytes) bind(c, name='depot_ipc_open')
      import :: c_int, c_size_t, c_ptr, c_char
      character(kind=c_char), dimension(*), intent(in) :: handle
      type(c_ptr), intent(out) :: mapping, ptr
      integer(c_size_t), intent(out) :: bytes
    end function depot_ipc_open

    integer(c_int) function depot_ipc_close(mapping) bind(c, name='depot_ipc_close')
      import :: c_int, c_ptr
      type(c_ptr), value :: mapping
    end function depot_ipc_close

    ! socket: a connected Unix socket's descriptor; timeout_ms: -1 none, else milliseconds
    integer(c_int) function depot_ipc_send(socket, kind, device, ptr, timeout_ms) bind(c, name='depot_ipc_send')
      import :: c_int, c_ptr
      integer(c_int), value :: socket, kind, device, timeout_ms
      type(c_ptr), value :: ptr
    end function depot_ipc_send

    integer(c_int) function depot_ipc_receive(socket, timeout_ms, mapping, ptr, bytes) &
        bind(c, name='depot_ipc_receive')
      import :: c_int, c_size_t, c_ptr
      integer(c_int), value :: socket, timeout_ms
      type(c_ptr), intent(out) :: mapping, ptr
      integer(c_size_t), intent(out) :: bytes
    end function depot_ipc_receive

    integer(c_int) function depot_ipc_receive_handle(socket, timeout_ms, received) &
        bind(c, name='depot_ipc_receive_handle')
      import :: c_int, c_ptr
      integer(c_int), value :: socket, timeout_ms
      type(c_ptr), intent(out) :: received
    end function depot_ipc_receive_handle

    integer(c_int) function depot_ipc_forward(socket, received, timeout_ms) bind(c, name='depot_ipc_forward')
      import :: c_int, c_ptr
      integer(c_int), value :: socket
      type(c_ptr), value :: received
      integer(c_int), value :: timeout_ms
    end function depot_ipc_forward

    integer(c_int) function depot_ipc_open_received(received, mapping, ptr, bytes) &
        bind(c, name='depot_ipc_open_received')
      import :: c_int, c_size_t, c_ptr
      type(c_ptr), value :: received
      type(c_ptr), intent(out) :: mapping, ptr
      integer(c_size_t), intent(out) :: bytes
    end function depot_ipc_open_received

    integer(c_int) function depot_ipc_received_free(received) bind(c, name='depot_ipc_received_free')
      import :: c_int, c_ptr
      type(c_ptr), value :: received
    end function depot_ipc_received_free

    type(c_ptr) function depot_last_error() bind(c, name='depot_last_error')
      import :: c_ptr
    end function depot_last_error

    type(c_ptr) function depot_status_name(status) bind(c, name='depot_status_name')
      import :: c_int, c_ptr
      integer(c_int), value :: status
    end function depot_status_name
  end interface

contains

  ! The calling thread's last error message as a Fortran string ("" if none).
  function depot_last_error_message() result(message)
    character(len=:), allocatable :: message
    character(kind=c_char), pointer :: chars(:)
    type(c_ptr) :: p
    integer :: n, i
    nullify (chars)
    p = depot_last_error()
    n = 0
    if (c_associated(p)) then
      call c_f_pointer(p, chars, [huge(0)])
      do while (chars(n + 1) /= c_null_char)
        n = n + 1
      end do
    end if
    allocate (character(len=n) :: message)
    do i = 1, n
      message(i:i) = chars(i)
    end do
  end function depot_last_error_message

end module depot_pool
