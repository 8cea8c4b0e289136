//! Moving bytes: synchronous copies between host and device and between devices, and
//! asynchronous copies on a stream whose scope keeps every borrowed buffer alive until the
//! copies finish (the `std::thread::scope` pattern), so no copy can outlive its memory.

use std::marker::PhantomData;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::backend::{Backend, BackendError};
use crate::buffer::{DeviceMemory, DeviceMemoryMut, Region};
use crate::layout::{DType, Element};

/// Why a copy could not run.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum CopyError {
    #[error("copy sizes differ: destination has {dst} bytes, source {src}; alias one side to the other's shape first")]
    LengthMismatch { dst: u64, src: u64 },
    #[error("host slice of {host:?} does not match buffer dtype {buffer:?}; alias the buffer with the host element type")]
    DTypeMismatch { host: DType, buffer: DType },
    #[error("source and destination overlap; copy through a separate buffer")]
    Overlap,
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the stream's worker thread stopped; create a new Stream")]
    StreamStopped,
}

fn same_backend(a: &Arc<dyn Backend>, b: &Arc<dyn Backend>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

fn check_lengths(dst: u64, src: u64) -> Result<(), CopyError> {
    if dst != src {
        return Err(CopyError::LengthMismatch { dst, src });
    }
    Ok(())
}

fn check_device_copy(dst: &Region<'_>, src: &Region<'_>) -> Result<(), CopyError> {
    check_lengths(dst.bytes, src.bytes)?;
    let overlap = dst.address < src.address + src.bytes && src.address < dst.address + dst.bytes;
    if same_backend(dst.backend, src.backend) && overlap && dst.bytes > 0 {
        return Err(CopyError::Overlap);
    }
    Ok(())
}

fn host_bytes<T: Element>(data: &[T]) -> &[u8] {
    // SAFETY: `Element` types are plain old data without padding.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

fn host_bytes_mut<T: Element>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: `Element` types are plain old data: any bytes written are a valid value.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data)) }
}

/// Which way a host copy goes: which side is the destination in a length error.
#[derive(Clone, Copy)]
enum Direction {
    ToDevice,
    ToHost,
}

fn check_host<T: Element>(
    region: &Region<'_>,
    host_len: usize,
    direction: Direction,
) -> Result<(), CopyError> {
    if region.dtype != T::DTYPE {
        return Err(CopyError::DTypeMismatch {
            host: T::DTYPE,
            buffer: region.dtype,
        });
    }
    match direction {
        Direction::ToDevice => check_lengths(region.bytes, host_len as u64),
        Direction::ToHost => check_lengths(host_len as u64, region.bytes),
    }
}

/// The raw copy between two checked regions. Across backends, a side the CPU addresses
/// directly (host or pinned memory) is read or written in place, so a pinned buffer reaches
/// a device at DMA speed; otherwise the bytes are staged through a host buffer.
///
/// # Safety
/// Both ranges must stay live and `dst` unaccessed by others until this returns.
unsafe fn copy_regions(
    dst_backend: &Arc<dyn Backend>,
    dst: u64,
    src_backend: &Arc<dyn Backend>,
    src: u64,
    bytes: u64,
) -> Result<(), CopyError> {
    // SAFETY: forwarded from the caller; a host-accessible range is live host memory.
    unsafe {
        if same_backend(dst_backend, src_backend) {
            dst_backend.copy_within(dst, src, bytes)?;
        } else if src_backend.host_accessible() {
            let source = std::slice::from_raw_parts(src as *const u8, bytes as usize);
            dst_backend.write_from_host(dst, source)?;
        } else if dst_backend.host_accessible() {
            let destination = std::slice::from_raw_parts_mut(dst as *mut u8, bytes as usize);
            src_backend.read_to_host(src, destination)?;
        } else {
            let mut staging = vec![0u8; bytes as usize];
            src_backend.read_to_host(src, &mut staging)?;
            dst_backend.write_from_host(dst, &staging)?;
        }
    }
    Ok(())
}

/// Copies `src` into `dst` (same or different devices) and returns when done.
pub fn copy(dst: &mut impl DeviceMemoryMut, src: &impl DeviceMemory) -> Result<(), CopyError> {
    let (dst, src) = (dst.region(), src.region());
    check_device_copy(&dst, &src)?;
    // SAFETY: the borrows keep both ranges live; `dst` is borrowed mutably so nothing else
    // accesses it.
    unsafe {
        copy_regions(
            dst.backend,
            dst.address,
            src.backend,
            src.address,
            src.bytes,
        )
    }
}

/// Copies host elements into a buffer of the matching dtype and byte size.
pub fn copy_from_host<T: Element>(
    dst: &mut impl DeviceMemoryMut,
    src: &[T],
) -> Result<(), CopyError> {
    let region = dst.region();
    check_host::<T>(&region, std::mem::size_of_val(src), Direction::ToDevice)?;
    // SAFETY: the mutable borrow keeps the range live and exclusive.
    unsafe {
        region
            .backend
            .write_from_host(region.address, host_bytes(src))?
    };
    Ok(())
}

/// Copies a buffer into host elements of the matching dtype and byte size.
pub fn copy_to_host<T: Element>(src: &impl DeviceMemory, dst: &mut [T]) -> Result<(), CopyError> {
    let region = src.region();
    check_host::<T>(&region, std::mem::size_of_val(dst), Direction::ToHost)?;
    // SAFETY: the borrow keeps the range live; nothing can write it through a shared borrow.
    unsafe {
        region
            .backend
            .read_to_host(region.address, host_bytes_mut(dst))?
    };
    Ok(())
}

type Job = Box<dyn FnOnce() + Send>;

/// An in-order queue of copies served by a worker thread (on a CUDA backend this is where
/// a `CUstream` would sit; here the host runs the copies).
#[derive(Debug)]
pub struct Stream {
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl Default for Stream {
    fn default() -> Self {
        Self::new()
    }
}

/// The outcome slot of an operation and the condition variable that announces it.
type Completion = (Mutex<Option<Result<(), CopyError>>>, Condvar);

/// Completion of one queued operation.
#[derive(Debug, Clone)]
pub struct Event {
    state: Arc<Completion>,
}

impl Event {
    fn pending() -> Self {
        Event {
            state: Arc::new((Mutex::new(None), Condvar::new())),
        }
    }

    fn complete(&self, result: Result<(), CopyError>) {
        let (slot, done) = &*self.state;
        *slot.lock() = Some(result);
        done.notify_all();
    }

    /// Blocks until the operation finished and returns its outcome.
    pub fn wait(&self) -> Result<(), CopyError> {
        let (slot, done) = &*self.state;
        let mut result = slot.lock();
        while result.is_none() {
            done.wait(&mut result);
        }
        result.clone().unwrap_or(Err(CopyError::StreamStopped))
    }

    /// Whether the operation finished.
    pub fn query(&self) -> bool {
        self.state.0.lock().is_some()
    }
}

impl Stream {
    /// Starts a stream with its own worker thread.
    pub fn new() -> Self {
        let (jobs, queue) = mpsc::channel::<Job>();
        let worker = std::thread::Builder::new()
            .name("headroom-mem-stream".into())
            .spawn(move || queue.into_iter().for_each(|job| job()))
            .ok();
        Stream {
            jobs: worker.as_ref().map(|_| jobs),
            worker,
        }
    }

    fn submit(&self, job: impl FnOnce() -> Result<(), CopyError> + Send + 'static) -> Event {
        let event = Event::pending();
        let completion = event.clone();
        let sent = self.jobs.as_ref().is_some_and(|jobs| {
            jobs.send(Box::new(move || completion.complete(job())))
                .is_ok()
        });
        if !sent {
            event.complete(Err(CopyError::StreamStopped));
        }
        event
    }

    /// Waits until everything queued so far has run.
    pub fn synchronize(&self) {
        // The queue is in order, so an empty job completes after all earlier ones. A
        // stopped worker runs nothing, so there is nothing to wait for either.
        let _ = self.submit(|| Ok(())).wait();
    }

    /// Runs `body` with a scope in which copies can be queued on this stream. Buffers they
    /// borrow stay borrowed until the scope ends, and the scope waits for every queued copy
    /// before returning (also when `body` panics).
    pub fn scope<'env, T>(
        &'env self,
        body: impl for<'scope> FnOnce(&'scope StreamScope<'scope, 'env>) -> T,
    ) -> T {
        struct SyncOnExit<'a>(&'a Stream);
        impl Drop for SyncOnExit<'_> {
            fn drop(&mut self) {
                self.0.synchronize();
            }
        }
        let scope = StreamScope {
            stream: self,
            _scope: PhantomData,
            _env: PhantomData,
        };
        let _sync = SyncOnExit(self);
        body(&scope)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// Queues copies on a [`Stream`]; see [`Stream::scope`].
#[derive(Debug)]
pub struct StreamScope<'scope, 'env: 'scope> {
    stream: &'env Stream,
    _scope: PhantomData<&'scope mut &'scope ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

impl<'scope> StreamScope<'scope, '_> {
    /// Queues a device-to-device (or cross-device) copy.
    pub fn copy<D: DeviceMemoryMut, S: DeviceMemory>(
        &'scope self,
        dst: &'scope mut D,
        src: &'scope S,
    ) -> Result<Event, CopyError> {
        let (dst, src) = (dst.region(), src.region());
        check_device_copy(&dst, &src)?;
        let (dst_backend, src_backend) = (dst.backend.clone(), src.backend.clone());
        let (dst, src, bytes) = (dst.address, src.address, src.bytes);
        Ok(self.stream.submit(move || {
            // SAFETY: the scope borrows both for 'scope and waits for this job before
            // 'scope ends, so the ranges are live and `dst` is exclusive while it runs.
            unsafe { copy_regions(&dst_backend, dst, &src_backend, src, bytes) }
        }))
    }

    /// Queues a host-to-device copy.
    pub fn copy_from_host<D: DeviceMemoryMut, T: Element>(
        &'scope self,
        dst: &'scope mut D,
        src: &'scope [T],
    ) -> Result<Event, CopyError> {
        let region = dst.region();
        check_host::<T>(&region, std::mem::size_of_val(src), Direction::ToDevice)?;
        let (backend, address) = (region.backend.clone(), region.address);
        let (pointer, len) = (src.as_ptr() as usize, std::mem::size_of_val(src));
        Ok(self.stream.submit(move || {
            // SAFETY: `src` is borrowed for 'scope, which outlasts this job.
            let bytes = unsafe { std::slice::from_raw_parts(pointer as *const u8, len) };
            // SAFETY: `dst` is mutably borrowed for 'scope, which outlasts this job.
            unsafe { backend.write_from_host(address, bytes) }.map_err(CopyError::from)
        }))
    }

    /// Queues a device-to-host copy.
    pub fn copy_to_host<S: DeviceMemory, T: Element>(
        &'scope self,
        src: &'scope S,
        dst: &'scope mut [T],
    ) -> Result<Event, CopyError> {
        let region = src.region();
        check_host::<T>(&region, std::mem::size_of_val(dst), Direction::ToHost)?;
        let (backend, address) = (region.backend.clone(), region.address);
        let (pointer, len) = (dst.as_mut_ptr() as usize, std::mem::size_of_val(dst));
        Ok(self.stream.submit(move || {
            // SAFETY: `dst` is mutably borrowed for 'scope, which outlasts this job.
            let bytes = unsafe { std::slice::from_raw_parts_mut(pointer as *mut u8, len) };
            // SAFETY: `src` is borrowed for 'scope, which outlasts this job.
            unsafe { backend.read_to_host(address, bytes) }.map_err(CopyError::from)
        }))
    }
}
