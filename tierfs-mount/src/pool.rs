//! [`Pool`]: the threads that run the FUSE operations which may wait.
//!
//! The session reads kernel requests on few threads (one by default), because a request
//! answered by the thread that last ran is answered fastest: the kernel hands each request to
//! the reader that has waited longest, and on a small machine waking a cold thread costs more
//! than tierfs's own work for a metadata operation. A request that may wait for something
//! other than the local disk (a fetch from the store, fsync's upload, the dirty bound) must
//! not hold up the others behind it, so the adapter hands it to this pool and replies from
//! there. A second pool of one thread (the reaper) removes freed data files after the reply
//! (`TierFuse::removal_result`). Invariants: every job handed to [`Pool::run`] runs exactly
//! once, even after a job before it panicked; [`Pool::shutdown`] returns only once no job is
//! queued or running.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed set of threads running boxed jobs in the order they were handed over.
#[derive(Debug)]
pub struct Pool {
    sender: Mutex<Option<Sender<Job>>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    /// Starts `threads` threads (at least one) named `name-N`.
    pub fn new(name: &str, threads: usize) -> std::io::Result<Pool> {
        let (sender, receiver) = channel::<Job>();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let receiver = Arc::clone(&receiver);
            handles.push(std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || work(&receiver))?);
        }
        Ok(Pool { sender: Mutex::new(Some(sender)), threads: Mutex::new(handles) })
    }

    /// Runs `job` on a pool thread. After [`Pool::shutdown`] it runs on the caller's thread.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) {
        let sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let Some(sender) = sender else { return job() };
        if let Err(returned) = sender.send(Box::new(job)) {
            (returned.0)();
        }
    }

    /// Runs what is queued, then stops the threads; later jobs run on the caller's thread.
    pub fn shutdown(&self) {
        self.sender.lock().unwrap_or_else(PoisonError::into_inner).take();
        for handle in self.threads.lock().unwrap_or_else(PoisonError::into_inner).drain(..) {
            let _ = handle.join();
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn work(receiver: &Mutex<Receiver<Job>>) {
    loop {
        let job = receiver.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(job) = job else { return };
        // A panicking job drops its reply, which answers the kernel with EIO; the thread must
        // survive it.
        if catch_unwind(AssertUnwindSafe(job)).is_err() {
            tracing::error!("a FUSE operation panicked on the pool; the kernel got EIO");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn shutdown_waits_for_every_job_and_a_panic_does_not_lose_the_rest() {
        let pool = Pool::new("test", 2).expect("pool");
        let done = Arc::new(AtomicUsize::new(0));
        for i in 0..20 {
            let done = Arc::clone(&done);
            pool.run(move || {
                std::thread::sleep(Duration::from_millis(5));
                if i == 3 {
                    panic!("job 3 fails");
                }
                done.fetch_add(1, Ordering::SeqCst);
            });
        }
        pool.shutdown();
        assert_eq!(done.load(Ordering::SeqCst), 19);
    }

    #[test]
    fn a_waiting_job_does_not_hold_up_the_next() {
        let pool = Pool::new("test", 2).expect("pool");
        let (release, blocked) = channel::<()>();
        pool.run(move || blocked.recv().expect("released"));
        let (tx, rx) = channel();
        pool.run(move || tx.send(()).expect("receiver"));
        rx.recv_timeout(Duration::from_secs(10)).expect("the second job ran while the first waited");
        release.send(()).expect("blocked job");
        pool.shutdown();
    }

    #[test]
    fn after_shutdown_jobs_run_on_the_callers_thread() {
        let pool = Pool::new("test", 1).expect("pool");
        pool.shutdown();
        let me = std::thread::current().id();
        let (tx, rx) = channel();
        pool.run(move || tx.send(std::thread::current().id()).expect("receiver"));
        assert_eq!(rx.try_recv().expect("ran already"), me);
    }
}
