//! Request bodies read into one buffer under memory budgets. Collecting a body frame by frame
//! keeps every frame as its own allocation: a body sent as one-byte chunks cost ~40 times its
//! size. Here the buffer is sized from `Content-Length` (or grown by doubling) and every byte of
//! capacity is first reserved from the connection's budget and the process-wide one, so neither
//! one HTTP/2 connection with many streams nor many connections can run the process out of
//! memory. (Reserving a declared length only as bytes arrive was tried: an HTTP/2 client whose
//! streams are refused later, mid-body, has more DATA in flight on them, and h2's limit on
//! streams reset for protocol errors then closes the whole connection.)
//!
//! A gzip body's inflated copy is reserved the same way as it grows (see [`inflate`]): 3 KB of
//! gzip can inflate to 3 MiB, and that copy lives through the whole admission.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use super::MAX_BODY_BYTES;

/// What an admission being answered holds per byte of its body: the body, the object's fields
/// parsed out of it (a 3 MiB annotation is a 3 MiB string) and what is built from them. Measured
/// on gzip-bombed AdmissionReviews padded by an annotation: about 2.5 (BENCHMARKS.md).
pub(crate) const ADMISSION_BYTES_PER_BODY_BYTE: usize = 3;
/// Bytes of body buffers one connection may hold at once: one full-size AdmissionReview being
/// answered (or three being read), or many ordinary ones multiplexed on one HTTP/2 connection
/// (the API server's way).
pub(crate) const CONNECTION_BODY_BUDGET: usize = ADMISSION_BYTES_PER_BODY_BYTE * MAX_BODY_BYTES;
/// Bytes of body buffers the whole process may hold at once, well inside the shipped
/// Deployment's 128 MiB memory limit (bodies are parsed into more memory than they take).
pub(crate) const PROCESS_BODY_BUDGET: usize = 16 * MAX_BODY_BYTES;
/// First capacity of a body that does not declare its length (and of an inflated one).
const INITIAL_CAPACITY: usize = 16 << 10;

/// A number of bytes that reservations draw from (memory, not the admission's time budget:
/// that is `crate::budget`).
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used: AtomicUsize,
    limit: usize,
}

impl ByteBudget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            used: AtomicUsize::new(0),
            limit,
        }
    }

    /// Bytes reserved now.
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
    budgets: [Arc<ByteBudget>; 2],
    bytes: usize,
}

impl Reservation {
    pub(crate) fn new(connection: Arc<ByteBudget>, process: Arc<ByteBudget>) -> Self {
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

    /// Raises the reservation to cover an admission of a `body_len`-byte body being answered
    /// ([`ADMISSION_BYTES_PER_BODY_BYTE`]); `false` (and nothing more taken) when a budget is
    /// exhausted.
    pub(crate) fn cover_admission(&mut self, body_len: usize) -> bool {
        let needed = ADMISSION_BYTES_PER_BODY_BYTE * body_len;
        self.grow_to(needed.max(self.bytes))
    }

    /// Lowers the reservation to `total` bytes (a buffer it paid for was freed).
    fn shrink_to(&mut self, total: usize) {
        let freed = self.bytes.saturating_sub(total);
        for budget in &self.budgets {
            budget.give_back(freed);
        }
        self.bytes -= freed;
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
    /// `Content-Encoding: gzip`, but not gzip.
    NotGzip(String),
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
        let capacity = needed.max(buffer.capacity() * 2).min(MAX_BODY_BYTES);
        grow(&mut buffer, needed, capacity, reservation)?;
        buffer.extend_from_slice(&data);
    }
    Ok(Bytes::from(buffer))
}

/// Makes room in `buffer` for `needed` bytes in all, growing it to `capacity` when it must grow,
/// once the reservation pays for it.
fn grow(
    buffer: &mut Vec<u8>,
    needed: usize,
    capacity: usize,
    reservation: &mut Reservation,
) -> Result<(), BodyError> {
    if needed > MAX_BODY_BYTES {
        return Err(BodyError::TooLarge);
    }
    if needed <= buffer.capacity() {
        return Ok(());
    }
    // The reservation pays for what is held besides this buffer too (the compressed body).
    let others = reservation.bytes.saturating_sub(buffer.capacity());
    if !reservation.grow_to(others + capacity) {
        return Err(BodyError::OverBudget);
    }
    buffer.reserve_exact(capacity - buffer.len());
    Ok(())
}

/// Inflates a gzip body, every byte of the inflated copy reserved before it is written, then
/// frees the compressed one.
///
/// Counting the inflated bytes (rather than refusing gzip past a small size) keeps gzip working
/// for any client that uses it, and makes a body cost the same memory however it was sent: a
/// 3 KB gzip bomb now holds what a 3 MiB plain body holds, within the same budgets. (The API
/// server itself never compresses a webhook request.)
pub(crate) fn inflate(
    compressed: Bytes,
    reservation: &mut Reservation,
) -> Result<Bytes, BodyError> {
    use std::io::Read as _;
    let mut decoder = flate2::read::GzDecoder::new(&compressed[..]);
    let mut inflated: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 8 << 10];
    loop {
        let n = decoder
            .read(&mut chunk)
            .map_err(|e| BodyError::NotGzip(e.to_string()))?;
        if n == 0 {
            break;
        }
        let needed = inflated.len() + n;
        // `grow` refuses `needed` past the limit before using the capacity.
        let capacity = needed
            .max(inflated.capacity() * 2)
            .clamp(INITIAL_CAPACITY, MAX_BODY_BYTES);
        grow(&mut inflated, needed, capacity, reservation)?;
        inflated.extend_from_slice(&chunk[..n]);
    }
    drop(decoder);
    drop(compressed);
    reservation.shrink_to(inflated.capacity());
    Ok(Bytes::from(inflated))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_draw_from_both_budgets_and_give_back_on_drop() {
        let connection = Arc::new(ByteBudget::new(100));
        let process = Arc::new(ByteBudget::new(150));
        let mut a = Reservation::new(connection.clone(), process.clone());
        assert!(a.grow_to(60));
        assert!(a.grow_to(100));
        assert!(!a.grow_to(101), "over the connection's budget");
        assert_eq!((connection.used(), process.used()), (100, 100));

        let other = Arc::new(ByteBudget::new(100));
        let mut b = Reservation::new(other.clone(), process.clone());
        assert!(!b.grow_to(60), "over the process's budget");
        assert_eq!(other.used(), 0, "a refused reservation takes nothing");
        assert!(b.grow_to(50));
        drop(a);
        assert_eq!((connection.used(), process.used()), (0, 50));
        drop(b);
        assert_eq!((other.used(), process.used()), (0, 0));
    }

    fn gzip(plain: &[u8]) -> Bytes {
        use std::io::Write as _;
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        encoder.write_all(plain).unwrap();
        encoder.finish().unwrap().into()
    }

    /// The compressed body's reservation, as `read` leaves it.
    fn reserved_for(
        compressed: &Bytes,
        connection: &Arc<ByteBudget>,
        process: &Arc<ByteBudget>,
    ) -> Reservation {
        let mut reservation = Reservation::new(connection.clone(), process.clone());
        assert!(reservation.grow_to(compressed.len()));
        reservation
    }

    #[test]
    fn inflated_bytes_are_reserved_as_they_grow() {
        let (connection, process) = (
            Arc::new(ByteBudget::new(CONNECTION_BODY_BUDGET)),
            Arc::new(ByteBudget::new(PROCESS_BODY_BUDGET)),
        );
        // A bomb: 3 MiB of spaces in about 3 KB.
        let bomb = gzip(&vec![b' '; MAX_BODY_BYTES]);
        assert!(bomb.len() < 4 << 10, "{}", bomb.len());
        let mut reservation = reserved_for(&bomb, &connection, &process);
        let inflated = inflate(bomb, &mut reservation).unwrap();
        assert_eq!(inflated.len(), MAX_BODY_BYTES);
        // The inflated copy is what is held now, in both budgets; the compressed one is freed.
        assert_eq!(reservation.bytes, MAX_BODY_BYTES);
        assert_eq!(
            (connection.used(), process.used()),
            (MAX_BODY_BYTES, MAX_BODY_BYTES)
        );
        drop((inflated, reservation));
        assert_eq!((connection.used(), process.used()), (0, 0));

        // A budget with less room than the inflated copy: refused, and nothing kept.
        let small = Arc::new(ByteBudget::new(MAX_BODY_BYTES / 2));
        let bomb = gzip(&vec![b' '; MAX_BODY_BYTES]);
        let mut reservation = reserved_for(&bomb, &small, &process);
        assert_eq!(
            inflate(bomb, &mut reservation).unwrap_err(),
            BodyError::OverBudget
        );
        drop(reservation);
        assert_eq!((small.used(), process.used()), (0, 0));

        // Inflating past the size limit, and something that is not gzip.
        let over = gzip(&vec![b' '; MAX_BODY_BYTES + 1]);
        let mut reservation = reserved_for(&over, &connection, &process);
        assert_eq!(
            inflate(over, &mut reservation).unwrap_err(),
            BodyError::TooLarge
        );
        drop(reservation);
        let mut reservation = reserved_for(&Bytes::new(), &connection, &process);
        let not_gzip = inflate(Bytes::from_static(b"not gzip"), &mut reservation);
        assert!(
            matches!(not_gzip, Err(BodyError::NotGzip(_))),
            "{not_gzip:?}"
        );
        drop(reservation);
        assert_eq!((connection.used(), process.used()), (0, 0));
    }
}
