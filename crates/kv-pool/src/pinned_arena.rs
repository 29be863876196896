//! The host tier's memory for a GPU pool: one pinned (page-locked) host
//! allocation, with copies queued by the cache and issued at `flush` on a
//! copy stream of its own, so that they run on the GPU's copy engines
//! beside the compute stream's kernels.
//!
//! Layout `[layer][slot][k|v ...]`, as the pool's `[layer][block]`: a run of
//! consecutive pool blocks going to (or from) consecutive slots is one
//! strided 2-D copy of every layer (`cuMemcpy2DAsync`, rows = layers), or
//! one copy per layer when a layer's stride exceeds the device's maximum
//! pitch. The copy stream and its two events are raw driver objects, not
//! cudarc's: a cudarc stream would switch candle's context to multi-stream
//! event tracking, whose implicit cross-stream waits break CUDA graph
//! capture. Ordering, on the GPU only (the host never waits): the copy stream
//! waits for the compute work queued before the flush (blocks being stored
//! hold their final KV; blocks being loaded are no longer read), and the
//! compute stream waits for the copies before its next kernel (an offloaded
//! block may be rewritten; a restored one is read). Copies issued by
//! `flush_async` (write-back of blocks that stay allocated; restores whose
//! sequence waits for them) skip that last wait, so the compute stream
//! runs on beside them; each such batch records an event of its own (its
//! ticket, polled by `done`), and the next `flush` orders them all (the
//! copy stream runs in order).

use std::collections::VecDeque;
use std::sync::Arc;

use candle_core::cuda::cudarc::driver::{result, sys, CudaContext, CudaStream};
use candle_core::cuda::WrapErr;
use candle_core::{bail, Result};

use crate::{block_runs, BlockId, CopyTicket, HostArena, HostSlot, KvStorage};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dir {
    Store,
    Load,
}

#[derive(Clone, Copy, Debug)]
struct Op {
    dir: Dir,
    block: BlockId,
    slot: HostSlot,
}

pub struct PinnedArena {
    host: *mut u8,
    capacity: usize,
    /// The pool: device base address, blocks, layers, bytes of one block of one layer.
    pool: u64,
    num_blocks: usize,
    num_layers: usize,
    layer_block_bytes: usize,
    max_pitch: usize,
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: sys::CUstream,
    /// Recorded on the compute stream; the copies wait for it.
    compute_done: sys::CUevent,
    /// Batches of copies not known to be done, oldest first: their ticket
    /// and the event recorded on the copy stream after them.
    in_flight: VecDeque<(CopyTicket, sys::CUevent)>,
    /// Events of finished batches, for reuse.
    spare_events: Vec<sys::CUevent>,
    /// The last ticket handed out.
    last_ticket: CopyTicket,
    /// The compute stream has not been ordered after the newest batch.
    unordered: bool,
    queued: Vec<Op>,
    moved: (u64, u64),
    /// Copy commands issued (runs after coalescing), for tests and logs.
    pub copies_issued: u64,
}

// SAFETY: the host allocation is owned by the arena and only touched
// through CUDA copies ordered on its streams; the engine thread owns it.
unsafe impl Send for PinnedArena {}

impl PinnedArena {
    /// An arena of `capacity` slots for the GPU pool `storage`.
    pub fn new(storage: &KvStorage, capacity: usize) -> Result<Self> {
        let (Some(t), Some(region)) = (storage.device_tensor(), storage.device_region()) else {
            bail!("PinnedArena: the KV pool is not on a GPU")
        };
        let compute = t.device().as_cuda_device()?.cuda_stream();
        let ctx = compute.context().clone();
        ctx.bind_to_thread().w()?;
        let layout = storage.layout();
        let bytes = capacity.max(1) * layout.bytes_per_block();
        // SAFETY: a fresh allocation, written only by copies from the pool.
        let host = unsafe { result::malloc_host(bytes, 0) }.w()? as *mut u8;
        let max_pitch = ctx.attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH).w()? as usize;
        let copy = result::stream::create(result::stream::StreamKind::NonBlocking).w()?;
        let compute_done = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).w()?;
        Ok(Self {
            host,
            capacity,
            pool: region.addr as u64,
            num_blocks: storage.num_blocks(),
            num_layers: layout.num_layers,
            layer_block_bytes: layout.layer_block_bytes(),
            max_pitch,
            ctx,
            compute,
            copy,
            compute_done,
            in_flight: VecDeque::new(),
            spare_events: Vec::new(),
            last_ticket: 0,
            unordered: false,
            queued: Vec::new(),
            moved: (0, 0),
            copies_issued: 0,
        })
    }

    fn device_addr(&self, layer: usize, block: BlockId) -> u64 {
        self.pool + ((layer * self.num_blocks + block as usize) * self.layer_block_bytes) as u64
    }

    fn host_addr(&self, layer: usize, slot: HostSlot) -> *mut u8 {
        // SAFETY (of the arithmetic): within the allocation for slot < capacity.
        unsafe { self.host.add((layer * self.capacity + slot as usize) * self.layer_block_bytes) }
    }

    /// Issues one run: `n` consecutive blocks from `block`, `n` consecutive slots from `slot`.
    fn issue(&mut self, dir: Dir, block: BlockId, slot: HostSlot, n: usize) -> Result<()> {
        let width = n * self.layer_block_bytes;
        let dev_pitch = self.num_blocks * self.layer_block_bytes;
        let host_pitch = self.capacity * self.layer_block_bytes;
        let s = self.copy;
        if dev_pitch <= self.max_pitch && host_pitch <= self.max_pitch {
            let d = self.device_addr(0, block);
            let h = self.host_addr(0, slot);
            // One end of the copy: (memory type, host address, device address, pitch).
            let device = (sys::CUmemorytype::CU_MEMORYTYPE_DEVICE, std::ptr::null_mut(), d, dev_pitch);
            let host = (sys::CUmemorytype::CU_MEMORYTYPE_HOST, h as *mut std::ffi::c_void, 0, host_pitch);
            let (src, dst) = match dir {
                Dir::Store => (device, host),
                Dir::Load => (host, device),
            };
            let p = sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: src.0,
                srcHost: src.1,
                srcDevice: src.2,
                srcArray: std::ptr::null_mut(),
                srcPitch: src.3,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: dst.0,
                dstHost: dst.1,
                dstDevice: dst.2,
                dstArray: std::ptr::null_mut(),
                dstPitch: dst.3,
                WidthInBytes: width,
                Height: self.num_layers,
            };
            // SAFETY: both ranges lie inside their allocations (block + n <=
            // num_blocks, slot + n <= capacity), ordered on the copy stream.
            let r = unsafe { sys::cuMemcpy2DAsync_v2(&p, s) };
            if r != sys::CUresult::CUDA_SUCCESS {
                bail!("cuMemcpy2DAsync ({dir:?}, {n} blocks): {r:?}");
            }
            self.copies_issued += 1;
        } else {
            for layer in 0..self.num_layers {
                let (d, h) = (self.device_addr(layer, block), self.host_addr(layer, slot));
                // SAFETY: as above, one layer's rows.
                let r = unsafe {
                    match dir {
                        Dir::Store => sys::cuMemcpyDtoHAsync_v2(h as *mut _, d, width, s),
                        Dir::Load => sys::cuMemcpyHtoDAsync_v2(d, h as *const _, width, s),
                    }
                };
                if r != sys::CUresult::CUDA_SUCCESS {
                    bail!("cuMemcpy ({dir:?}, layer {layer}, {n} blocks): {r:?}");
                }
                self.copies_issued += 1;
            }
        }
        let bytes = (width * self.num_layers) as u64;
        match dir {
            Dir::Store => self.moved.0 += bytes,
            Dir::Load => self.moved.1 += bytes,
        }
        Ok(())
    }

    /// Issues the queued copies as one batch (a new ticket; the last one
    /// when nothing is queued); with `order`, the compute stream waits for
    /// every batch issued so far.
    fn try_flush(&mut self, order: bool) -> Result<CopyTicket> {
        let wait = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        if !self.queued.is_empty() {
            self.ctx.bind_to_thread().w()?;
            let event = match self.spare_events.pop() {
                Some(e) => e,
                None => result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).w()?,
            };
            // SAFETY: live stream and event handles of this context.
            unsafe {
                result::event::record(self.compute_done, self.compute.cu_stream()).w()?;
                result::stream::wait_event(self.copy, self.compute_done, wait).w()?;
            }
            let ops = std::mem::take(&mut self.queued);
            for run in runs(&ops) {
                self.issue(run.0.dir, run.0.block, run.0.slot, run.1)?;
            }
            // SAFETY: as above.
            unsafe { result::event::record(event, self.copy) }.w()?;
            self.last_ticket += 1;
            self.in_flight.push_back((self.last_ticket, event));
            self.unordered = true;
        }
        if order && self.unordered {
            if let Some(&(_, newest)) = self.in_flight.back() {
                self.ctx.bind_to_thread().w()?;
                // SAFETY: as above; the copy stream runs in order, so its
                // newest event follows every copy.
                unsafe { result::stream::wait_event(self.compute.cu_stream(), newest, wait) }.w()?;
            }
            self.unordered = false;
        }
        Ok(self.last_ticket)
    }

    /// Retires finished batches; whether `ticket`'s is among them.
    fn try_done(&mut self, ticket: CopyTicket) -> Result<bool> {
        while let Some(&(t, event)) = self.in_flight.front() {
            if t > ticket {
                return Ok(true);
            }
            self.ctx.bind_to_thread().w()?;
            // SAFETY: a live event of this context.
            match unsafe { sys::cuEventQuery(event) } {
                sys::CUresult::CUDA_SUCCESS => {
                    self.in_flight.pop_front();
                    self.spare_events.push(event);
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => return Ok(false),
                e => bail!("cuEventQuery: {e:?}"),
            }
        }
        Ok(true)
    }

    /// Waits until every issued copy is done (tests and benchmarks).
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind_to_thread().w()?;
        // SAFETY: a live stream of this context.
        unsafe { result::stream::synchronize(self.copy) }.w()
    }
}

/// Maximal runs of `ops`, in order: consecutive operations of one direction
/// whose blocks and slots both step by one ([`block_runs`]).
fn runs(ops: &[Op]) -> Vec<(Op, usize)> {
    let mut out = Vec::new();
    for seg in ops.chunk_by(|a, b| a.dir == b.dir) {
        let pairs: Vec<(BlockId, HostSlot)> = seg.iter().map(|o| (o.block, o.slot)).collect();
        for (block, slot, n) in block_runs(&pairs) {
            out.push((Op { dir: seg[0].dir, block, slot }, n));
        }
    }
    out
}

impl HostArena for PinnedArena {
    fn capacity(&self) -> usize {
        self.capacity
    }

    fn store(&mut self, _storage: &KvStorage, block: BlockId, slot: HostSlot) {
        assert!((slot as usize) < self.capacity && (block as usize) < self.num_blocks);
        self.queued.push(Op { dir: Dir::Store, block, slot });
    }

    fn load(&mut self, _storage: &mut KvStorage, slot: HostSlot, block: BlockId) {
        assert!((slot as usize) < self.capacity && (block as usize) < self.num_blocks);
        self.queued.push(Op { dir: Dir::Load, block, slot });
    }

    fn flush(&mut self) {
        // A failed copy leaves KV undefined: nothing can continue safely.
        if let Err(e) = self.try_flush(true) {
            panic!("host tier copy failed: {e}");
        }
    }

    fn flush_async(&mut self) -> CopyTicket {
        self.try_flush(false).unwrap_or_else(|e| panic!("host tier copy failed: {e}"))
    }

    fn done(&mut self, ticket: CopyTicket) -> bool {
        self.try_done(ticket).unwrap_or_else(|e| panic!("host tier copy failed: {e}"))
    }

    fn wait(&mut self, ticket: CopyTicket) {
        let event = self.in_flight.iter().rev().find(|(t, _)| *t <= ticket).map(|&(_, e)| e);
        if let Some(event) = event {
            // SAFETY: a live event of this context.
            let r = self.ctx.bind_to_thread().w().and_then(|_| unsafe { result::event::synchronize(event) }.w());
            if let Err(e) = r {
                panic!("host tier copy failed: {e}");
            }
        }
        self.done(ticket);
    }

    fn asynchronous(&self) -> bool {
        true
    }

    fn wait_all(&mut self) {
        self.flush();
        if let Err(e) = self.synchronize() {
            panic!("host tier copy failed: {e}");
        }
    }

    fn bytes_moved(&self) -> (u64, u64) {
        self.moved
    }
}

impl Drop for PinnedArena {
    fn drop(&mut self) {
        let _ = self.synchronize();
        // SAFETY: created in `new`, no copy pending; the host memory came from malloc_host.
        unsafe {
            let _ = result::event::destroy(self.compute_done);
            for (_, e) in self.in_flight.drain(..) {
                let _ = result::event::destroy(e);
            }
            for e in self.spare_events.drain(..) {
                let _ = result::event::destroy(e);
            }
            let _ = result::stream::destroy(self.copy);
            let _ = result::free_host(self.host as *mut _);
        }
    }
}
