//! Request bodies read into one buffer under memory budgets. Collecting a body frame by frame
//! keeps every frame as its own allocation: a body sent as one-byte chunks cost ~40 times its
//! size. Here the buffer is sized from `Content-Length` (or grown by doubling) and every byte of
//! capacity is first reserved from the connection's budget and the process-wide one, so neither
//! one HTTP/2 connection with many streams nor many connections can run the process out of
//! memory.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use super::MAX_BODY_BYTES;

/// Bytes of body buffers one connection may hold at once: two full-size AdmissionReviews, or
/// many ordinary ones multiplexed on one HTTP/2 connection (the API server's way).
pub(crate) const CONNECTION_BODY_BUDGET: usize = 2 * MAX_BODY_BYTES;
/// Bytes of body buffers the whole process may hold at once, well inside the shipped
/// Deployment's 128 MiB memory limit (bodies are parsed into more memory than they take).
pub(crate) const PROCESS_BODY_BUDGET: usize = 16 * MAX_BODY_BYTES;
/// First capacity of a body that does not declare its length.
const INITIAL_CAPACITY: usize = 16 << 10;

/// A number of bytes that reservations draw from.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicUsize,
    limit: usize,
}

impl Budget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    #[cfg(test)]
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    fn try_take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes held from both budgets; given back when dropped, so it must live as long as the
/// buffer it pays for.
#[derive(Debug)]
pub(crate) struct Reservation {
    budgets: [Arc<Budget>; 2],
    bytes: usize,
}

impl Reservation {
    pub(crate) fn new(connection: Arc<Budget>, process: Arc<Budget>) -> Self {
        Self {
            budgets: [connection, process],
            bytes: 0,
        }
    }

    /// Raises the reservation to `total` bytes; `false` (and nothing taken) when a budget is
    /// exhausted.
    fn grow_to(&mut self, total: usize) -> bool {
        let extra = total.saturating_sub(self.bytes);
        if extra == 0 {
            return true;
        }
        let [connection, process] = &self.budgets;
        if !connection.try_take(extra) {
            return false;
        }
        if !process.try_take(extra) {
            connection.give_back(extra);
            return false;
        }
        self.bytes = total;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        for budget in &self.budgets {
            budget.give_back(self.bytes);
        }
    }
}

/// Why a body was not read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BodyError {
    TooLarge,
    /// A memory budget is exhausted: the server is busy, the client may retry.
    OverBudget,
    Unreadable(String),
}

/// Reads `body` into one buffer. `declared` is its `Content-Length`. The caller bounds the time.
pub(crate) async fn read(
    mut body: Incoming,
    declared: Option<u64>,
    reservation: &mut Reservation,
) -> Result<Bytes, BodyError> {
    let declared = match declared {
        Some(n) if n > MAX_BODY_BYTES as u64 => return Err(BodyError::TooLarge),
        Some(n) => Some(n as usize),
        None => None,
    };
    // A declared length is trusted for the first allocation only up to the limit checked above;
    // a client that lies gets an error from hyper, never more than it declared.
    let first = declared.unwrap_or(INITIAL_CAPACITY);
    if !reservation.grow_to(first) {
        return Err(BodyError::OverBudget);
    }
    let mut buffer = Vec::with_capacity(first);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Unreadable(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let needed = buffer.len() + data.len();
        if needed > MAX_BODY_BYTES {
            return Err(BodyError::TooLarge);
        }
        if needed > buffer.capacity() {
            let capacity = needed.max(buffer.capacity() * 2).min(MAX_BODY_BYTES);
            if !reservation.grow_to(capacity) {
                return Err(BodyError::OverBudget);
            }
            buffer.reserve_exact(capacity - buffer.len());
        }
        buffer.extend_from_slice(&data);
    }
    Ok(Bytes::from(buffer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_draw_from_both_budgets_and_give_back_on_drop() {
        let connection = Arc::new(Budget::new(100));
        let process = Arc::new(Budget::new(150));
        let mut a = Reservation::new(connection.clone(), process.clone());
        assert!(a.grow_to(60));
        assert!(a.grow_to(100));
        assert!(!a.grow_to(101), "over the connection's budget");
        assert_eq!((connection.used(), process.used()), (100, 100));

        let other = Arc::new(Budget::new(100));
        let mut b = Reservation::new(other.clone(), process.clone());
        assert!(!b.grow_to(60), "over the process's budget");
        assert_eq!(other.used(), 0, "a refused reservation takes nothing");
        assert!(b.grow_to(50));
        drop(a);
        assert_eq!((connection.used(), process.used()), (0, 50));
        drop(b);
        assert_eq!((other.used(), process.used()), (0, 0));
    }
}
