//! A space's background write-back (device side: `cuda/strata/write_back.cuh`). Every kernel
//! launched with the space's handle gets the space's write-back warps beside it: Strata's
//! `strata_write_back` kernel on a high-priority stream of the space's own, queued right after
//! the user's kernel (so it never holds a multiprocessor the user's first blocks wanted), and a
//! one-thread `strata_write_back_stop` queued after the user's kernel on the user's stream,
//! which ends them. Launch numbers make every stop end exactly the warps of launches queued
//! before it, whatever the streams, and the warps stop by themselves once the space has served
//! no fault for the idle time, so nothing can keep them alive. Host maintenance waits for the
//! whole context, write-back warps included, so it never runs beside them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use cudarc::driver::sys;

use super::{BackgroundWriteBack, SpaceError};
use crate::driver::{Args, DeviceBuffer, Function, Gpu, Grid, LaunchCompanion, Stream};
use crate::layout::{SpaceHandle, WriteBackControl};

/// Warps per write-back block.
const WARPS_PER_BLOCK: u32 = 8;

/// The write-back warps of one space.
#[derive(Debug)]
pub(crate) struct WriteBackWarps {
    gpu: Arc<Gpu>,
    run: Function,
    stop: Function,
    stream: Stream,
    control: DeviceBuffer,
    handle: SpaceHandle<'static>,
    grid: Grid,
    /// Launches so far (the next one gets this plus one).
    launches: AtomicU64,
}

impl WriteBackWarps {
    /// Write-back warps for the space of `handle` (`frames` frames), registered with the GPU
    /// so that launches carrying the handle start them.
    pub(crate) fn start(
        gpu: &Arc<Gpu>,
        run: &Function,
        stop: &Function,
        handle: SpaceHandle<'static>,
        options: &BackgroundWriteBack,
    ) -> Result<Arc<Self>, SpaceError> {
        options.validate()?;
        let frames = f64::from(handle.frame_count);
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "fractions in (0, 0.5] of a u32 frame count"
        )]
        let mark = |fraction: f64| (frames * fraction).ceil() as u32;
        let control = DeviceBuffer::zeroed(gpu, std::mem::size_of::<WriteBackControl>())?;
        let high_water = mark(options.high_water).max(1);
        control.upload(
            0,
            &[WriteBackControl {
                stop: 0,
                idle_ns: u64::try_from(options.idle.as_nanos()).unwrap_or(u64::MAX),
                cursor: 0,
                high_water,
                low_water: mark(options.low_water).min(high_water),
                reserved: 0,
            }],
        )?;
        let warps = options.warps;
        let grid = Grid {
            blocks: warps.div_ceil(WARPS_PER_BLOCK),
            threads: 32 * warps.min(WARPS_PER_BLOCK),
        };
        let me = Arc::new(WriteBackWarps {
            gpu: gpu.clone(),
            run: run.clone(),
            stop: stop.clone(),
            stream: Stream::new_high_priority(gpu)?,
            control,
            handle,
            grid,
            launches: AtomicU64::new(0),
        });
        let weak = Arc::downgrade(&me);
        gpu.add_companion(handle.counters, weak);
        Ok(me)
    }

    /// No later launch starts these warps (the space is going away).
    pub(crate) fn retire(&self) {
        self.gpu.remove_companion(self.handle.counters);
    }
}

impl LaunchCompanion for WriteBackWarps {
    fn after_launch(&self, stream: sys::CUstream) {
        let launch = self.launches.fetch_add(1, Ordering::Relaxed) + 1;
        let control = self.control.ptr();
        let run = self.run.launch_raw(
            self.grid,
            &Args::new()
                .arg(self.handle)
                .arg(control)
                .arg(launch)
                .alone(),
            self.stream.raw(),
        );
        if let Err(e) = run {
            // The user's kernel runs anyway; its faults write their victims themselves.
            tracing::warn!("background write-back not started for this launch: {e}");
            return;
        }
        let one = Grid {
            blocks: 1,
            threads: 32,
        };
        let args = Args::new().arg(control).arg(launch);
        if let Err(e) = self.stop.launch_raw(one, &args, stream) {
            // The warps end after the idle time without faults instead.
            tracing::warn!("background write-back: its stop could not be queued: {e}");
        }
    }
}
