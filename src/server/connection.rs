//! What one connection is doing, for its watchdog: whether a request is in progress, since when
//! it has been idle, and when the client started sending the next request's head; and for the
//! connection slots ([`super::slots`]): busy, idle, or idle after answering an admission. hyper's own
//! timers do not cover an accepted connection that never sends a byte (the auto builder waits
//! for the protocol preface forever), nor an idle HTTP/2 connection.

use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::body::ByteBudget;
use super::slots::{Slot, SlotHandle, Standing};

/// One connection's activity.
#[derive(Debug)]
pub(crate) struct ConnectionState {
    active: AtomicUsize,
    times: Mutex<Times>,
    /// Woken when the deadline may have moved.
    changed: Notify,
    /// HTTP/1.1: a request's head starts with the first byte read while idle. (HTTP/2 connections
    /// carry PINGs and window updates that are not requests.)
    track_heads: bool,
    /// Bytes of body buffers this connection holds.
    pub(crate) bodies: Arc<ByteBudget>,
    /// Its peer address's share of the process's body budget (taken once, when accepted).
    pub(crate) peer_bodies: Arc<ByteBudget>,
    /// The client's address.
    pub(crate) peer: IpAddr,
    /// Its connection slot, told when the connection is busy and when idle; `None` for a
    /// connection let in past the cap for probes, until a request of another kind takes a slot.
    slot: Mutex<Option<SlotHandle>>,
    /// The slot such a connection took for its request (its task holds a regular one).
    promoted: Mutex<Option<Slot>>,
    /// An admission was answered on this connection: its slot is taken back last.
    served: AtomicBool,
}

#[derive(Debug)]
struct Times {
    idle_since: Instant,
    head_started: Option<Instant>,
}

impl ConnectionState {
    /// A connection that has just been accepted. Its first request's head is due within the read
    /// timeout, as if it had started now: a client opens a connection to send a request, and one
    /// that sends nothing is only holding a file descriptor.
    pub(crate) fn new(
        track_heads: bool,
        (body_budget, peer_bodies): (usize, Arc<ByteBudget>),
        peer: IpAddr,
        slot: Option<SlotHandle>,
    ) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Self {
            active: AtomicUsize::new(0),
            times: Mutex::new(Times {
                idle_since: now,
                head_started: Some(now),
            }),
            changed: Notify::new(),
            track_heads,
            bodies: Arc::new(ByteBudget::new(body_budget)),
            peer_bodies,
            peer,
            slot: Mutex::new(slot),
            promoted: Mutex::new(None),
            served: AtomicBool::new(false),
        })
    }

    fn slot(&self) -> Option<SlotHandle> {
        self.slot
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Whether the connection holds a regular slot (not only the probes' headroom).
    pub(crate) fn has_slot(&self) -> bool {
        self.slot().is_some()
    }

    /// Gives a connection let in for probes the slot `promoted` took for its request.
    pub(crate) fn promote(&self, promoted: Slot) {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(promoted.handle());
        *self.promoted.lock().unwrap_or_else(|p| p.into_inner()) = Some(promoted);
    }

    /// An admission was answered on this connection.
    pub(crate) fn served(&self) {
        self.served.store(true, Ordering::Relaxed);
    }

    /// Whether an admission was answered on this connection (the API server's): its bodies may
    /// draw on the serving reserve.
    pub(crate) fn has_served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    fn times(&self) -> MutexGuard<'_, Times> {
        // The fields stay consistent whatever panicked while holding the lock.
        self.times
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn bytes_read(&self) {
        if !self.track_heads || self.active.load(Ordering::Acquire) > 0 {
            return;
        }
        let mut times = self.times();
        if times.head_started.is_none() {
            times.head_started = Some(Instant::now());
            drop(times);
            self.changed.notify_one();
        }
    }

    /// A request has arrived (its head is read). Returns when its first byte came, if known, so
    /// the request's read deadline can count from there.
    pub(crate) fn request_started(self: &Arc<Self>) -> (ActiveRequest, Option<Instant>) {
        if self.active.fetch_add(1, Ordering::AcqRel) == 0 {
            if let Some(slot) = self.slot() {
                slot.busy();
            }
        }
        let head_started = self.times().head_started.take();
        self.changed.notify_one();
        (ActiveRequest(self.clone()), head_started)
    }

    /// When the connection is to be closed unless something happens first: `None` while a
    /// request is in progress (its own deadline bounds it).
    pub(crate) fn deadline(
        &self,
        idle_timeout: Duration,
        read_timeout: Duration,
    ) -> Option<Instant> {
        if self.active.load(Ordering::Acquire) > 0 {
            return None;
        }
        let times = self.times();
        let idle = times.idle_since + idle_timeout;
        Some(match times.head_started {
            Some(started) => idle.min(started + read_timeout),
            None => idle,
        })
    }

    /// Resolves when [`Self::deadline`] may have changed.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await;
    }
}

/// A request in progress on a connection; the connection is idle again when the last is dropped.
#[derive(Debug)]
pub(crate) struct ActiveRequest(Arc<ConnectionState>);

impl Drop for ActiveRequest {
    fn drop(&mut self) {
        if self.0.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.times().idle_since = Instant::now();
            if let Some(slot) = self.0.slot() {
                slot.idle(if self.0.served.load(Ordering::Relaxed) {
                    Standing::Serving
                } else {
                    Standing::Idle
                });
                // A request that started meanwhile (another h2 stream) may have found the slot
                // still busy: it is busy again.
                if self.0.active.load(Ordering::Acquire) > 0 {
                    slot.busy();
                }
            }
        }
        self.0.changed.notify_one();
    }
}

/// A stream that tells its connection's state when bytes arrive.
pub(crate) struct Tracked<S> {
    inner: S,
    state: Arc<ConnectionState>,
}

impl<S> Tracked<S> {
    pub(crate) fn new(inner: S, state: Arc<ConnectionState>) -> Self {
        Self { inner, state }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.state.bytes_read();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_and_head_deadlines() {
        let (idle, read) = (Duration::from_secs(60), Duration::from_secs(5));
        let before = Instant::now();
        let peer = IpAddr::from([127, 0, 0, 1]);
        let state = ConnectionState::new(true, (0, Arc::new(ByteBudget::new(0))), peer, None);
        let after = Instant::now();
        let due = state.deadline(idle, read).unwrap();
        assert!(
            before + read <= due && due <= after + read,
            "silent since accepted: the first head is due within the read timeout"
        );
        let (first, started) = state.request_started();
        assert!(started.is_some_and(|t| before <= t && t <= after));
        assert_eq!(state.deadline(idle, read), None, "busy: never idle");
        state.bytes_read(); // its body
        let before = Instant::now();
        drop(first);
        let due = state.deadline(idle, read).unwrap();
        assert!(before + idle <= due && due <= Instant::now() + idle, "idle");

        let before = Instant::now();
        state.bytes_read(); // the next head
        let due = state.deadline(idle, read).unwrap();
        assert!(before + read <= due && due <= Instant::now() + read, "head");
        let (second, started) = state.request_started();
        assert!(started.is_some_and(|t| before <= t));
        drop(second);
        assert!(state.deadline(idle, read).unwrap() >= Instant::now() + read * 2);

        let h2 = ConnectionState::new(false, (0, Arc::new(ByteBudget::new(0))), peer, None);
        drop(h2.request_started());
        h2.bytes_read(); // a PING is not a request
        assert!(h2.deadline(idle, read).unwrap() >= Instant::now() + read * 2);
    }
}
