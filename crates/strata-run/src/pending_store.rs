//! A store that is still being opened: the arena starts at once over it, and the opening
//! (connecting and authenticating to memory nodes: 20-40 ms on loopback, mostly UCX's own
//! start-up) goes on in a background thread while the program runs.
//!
//! Why this is safe to defer: the arena's first touches are zero fills (space never used is
//! discarded when handed out, so its faults install zeros without reading the store), so the
//! store is first needed when the budget is full and a dirty page must be written back, or a
//! page written back earlier is read again. Whoever needs it first waits for the opening to
//! end; a program whose data fits its budget never waits at all.

use std::sync::{Arc, Condvar, Mutex};

use strata_core::store::ReadRequest;
use strata_core::{Store, StoreError};

/// How the opening ended.
type Opened = Result<Arc<dyn Store>, String>;

#[derive(Debug, Default)]
struct Slot {
    opened: Mutex<Option<Opened>>,
    done: Condvar,
}

impl Slot {
    fn wait(&self) -> Opened {
        let mut g = self.opened.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(o) = g.as_ref() {
                return o.clone();
            }
            g = self.done.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn set(&self, o: Opened) {
        *self.opened.lock().unwrap_or_else(|e| e.into_inner()) = Some(o);
        self.done.notify_all();
    }
}

/// A [`Store`] of a known size whose real store is opened by a background thread; every
/// operation waits for the opening to end, then goes to the real store (or fails with
/// [`StoreError::Unavailable`] and the reason the opening failed).
#[derive(Debug)]
pub struct PendingStore {
    size: u64,
    description: String,
    slot: Arc<Slot>,
}

impl PendingStore {
    /// Starts `open` on a thread named `thread_name` (name it `strata-*` inside the
    /// interposer, so that its allocations go to the C library) and returns at once. The
    /// store answers `size` and `description` until it is open. `on_failure` runs on that
    /// thread with the reason when the opening fails, before any waiting operation fails (the
    /// runtime ends the process there).
    pub fn spawn<F, E>(
        size: u64,
        description: String,
        thread_name: &str,
        open: F,
        on_failure: E,
    ) -> std::io::Result<Self>
    where
        F: FnOnce() -> Result<Arc<dyn Store>, String> + Send + 'static,
        E: FnOnce(&str) + Send + 'static,
    {
        let slot = Arc::new(Slot::default());
        let filled = Arc::clone(&slot);
        std::thread::Builder::new()
            .name(thread_name.into())
            .spawn(move || {
                let opened = match open() {
                    Ok(s) if s.size() < size => Err(format!(
                        "the store opened with {} bytes, fewer than the {size} asked for",
                        s.size()
                    )),
                    other => other,
                };
                // A failure is handed to `on_failure` before anyone waiting sees it, so
                // that the runtime can end the process with the reason before a waiting
                // fault turns it into a SIGBUS.
                if let Err(why) = &opened {
                    on_failure(why);
                }
                filled.set(opened);
            })?;
        Ok(Self {
            size,
            description,
            slot,
        })
    }

    /// Whether the opening has ended (either way), without waiting.
    pub fn settled(&self) -> bool {
        self.slot
            .opened
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Waits for the opening to end; whether it opened the store.
    pub fn wait_opened(&self) -> bool {
        self.slot.wait().is_ok()
    }

    fn store(&self) -> Result<Arc<dyn Store>, StoreError> {
        self.slot.wait().map_err(|reason| StoreError::Unavailable {
            store: self.description.clone(),
            reason: format!("it could not be opened: {reason}"),
        })
    }
}

impl Store for PendingStore {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.store()?.read_at(offset, buf)
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<(), StoreError> {
        self.store()?.write_at(offset, buf)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.store()?.flush()
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn read_batch(&self, requests: &mut [ReadRequest<'_>]) -> Result<(), StoreError> {
        self.store()?.read_batch(requests)
    }

    fn write_batch(&self, requests: &[(u64, &[u8])]) -> Result<(), StoreError> {
        self.store()?.write_batch(requests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};
    use strata_core::MemoryStore;

    fn seed() -> u64 {
        let s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| u64::from(d.subsec_nanos()) ^ d.as_secs())
            | 1;
        println!("seed {s}");
        s
    }

    fn bytes(seed: u64, n: usize) -> Vec<u8> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()[0]
            })
            .collect()
    }

    #[test]
    fn returns_at_once_and_serves_after_the_opening_ends() {
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let started = Instant::now();
        let store = PendingStore::spawn(
            1 << 20,
            "slow memory".into(),
            "strata-test-open",
            move || {
                // Opens only when the test says so: nothing may wait for this before.
                go_rx.recv().map_err(|e| e.to_string())?;
                Ok(Arc::new(MemoryStore::new(1 << 20)) as Arc<dyn Store>)
            },
            |why| panic!("the opening failed: {why}"),
        )
        .unwrap();
        assert!(started.elapsed() < Duration::from_secs(1));
        assert!(!store.settled());
        assert_eq!(store.size(), 1 << 20);
        assert_eq!(store.describe(), "slow memory");
        let data = bytes(seed(), 8192);
        let store = Arc::new(store);
        let writer = {
            let store = Arc::clone(&store);
            let data = data.clone();
            std::thread::spawn(move || {
                store.write_batch(&[(4096, &data[..4096]), (65536, &data[4096..])])
            })
        };
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !writer.is_finished(),
            "a write went through before the store was open"
        );
        go_tx.send(()).unwrap();
        writer.join().unwrap().unwrap();
        assert!(store.settled());
        assert!(store.wait_opened());
        let mut back = vec![0u8; 4096];
        store.read_at(4096, &mut back).unwrap();
        assert_eq!(back, data[..4096]);
        store.read_at(65536, &mut back).unwrap();
        assert_eq!(back, data[4096..]);
        store.read_at(0, &mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "never-written bytes must read as zeros"
        );
        assert!(store.read_at((1 << 20) - 100, &mut back).is_err());
        store.flush().unwrap();
    }

    #[test]
    fn a_failed_opening_fails_every_operation_with_its_reason() {
        let (failed_tx, failed_rx) = mpsc::channel::<String>();
        let store = PendingStore::spawn(
            4096,
            "remote:nowhere".into(),
            "strata-test-open",
            || Err("connection refused by 127.0.0.1:1".into()),
            move |why| failed_tx.send(why.to_string()).unwrap(),
        )
        .unwrap();
        let why = failed_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(why.contains("connection refused"), "{why}");
        assert!(!store.wait_opened());
        let mut buf = [0u8; 16];
        for e in [
            store.read_at(0, &mut buf).unwrap_err(),
            store.write_at(0, &buf).unwrap_err(),
            store.flush().unwrap_err(),
        ] {
            let msg = e.to_string();
            assert!(
                msg.contains("remote:nowhere") && msg.contains("connection refused"),
                "{msg}"
            );
        }
    }

    #[test]
    fn a_store_smaller_than_asked_is_refused() {
        let (failed_tx, failed_rx) = mpsc::channel::<String>();
        let store = PendingStore::spawn(
            1 << 20,
            "small".into(),
            "strata-test-open",
            || Ok(Arc::new(MemoryStore::new(4096)) as Arc<dyn Store>),
            move |why| failed_tx.send(why.to_string()).unwrap(),
        )
        .unwrap();
        let why = failed_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert!(why.contains("fewer than"), "{why}");
        assert!(store.write_at(0, &[1]).is_err());
    }
}
