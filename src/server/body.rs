//! Request bodies read into one buffer under memory budgets. Collecting a body frame by frame
//! keeps every frame as its own allocation: a body sent as one-byte chunks cost ~40 times its
//! size. Here the buffer grows (by doubling, never past the declared `Content-Length`) as the
//! bytes **arrive**, and every byte of capacity is first reserved from the connection's budget,
//! its peer address's share and the process-wide budget — so neither one HTTP/2 connection with
//! many streams, nor many connections, nor one client's many connections can run the process
//! out of memory, and a body that declares 3 MiB and stalls holds what it sent (issue 34: 16
//! such connections, reserved as declared, refused every other admission).
//!
//! The process budget keeps a reserve ([`SERVING_RESERVE`]) that only connections which have
//! already had an admission answered (the API server's) may draw on once their peer's share or
//! the rest of the budget is spent: whatever new connections hold, the API server's open
//! connection still gets its admissions read. An HTTP/2 stream refused mid-body has the rest of
//! its body read and dropped before it is answered, so the client sends no DATA on a reset
//! stream (h2 closes a whole connection after too many of those).
//!
//! When the process budget (and, for a serving connection, the reserve) is spent, a new body
//! does not simply get a 503: the body reads that hold memory without earning it — stalled, or
//! too slow to finish before their deadline, of a peer holding more than the newcomer's — are
//! evicted first ([`flights`]), and it is read once they have given their memory back. The reserve stays: eviction frees only bodies being
//! *read*, and bodies read whole and being answered (16 gzip bombs waiting on a registry that
//! never answers) hold the open budget just as well; the API server's connection still gets
//! its admissions read then.
//!
//! A gzip body's inflated copy is reserved the same way as it grows (see [`inflate`]): 3 KB of
//! gzip can inflate to 3 MiB, and that copy lives through the whole admission.

use std::collections::HashMap;
use std::future::Future as _;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::Poll;

use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use super::MAX_BODY_BYTES;

mod flights;
pub(crate) use flights::Window;
use flights::{Flight, Flights};

/// What an admission being answered holds per byte of its body: the body, the object's fields
/// parsed out of it (a 3 MiB annotation is a 3 MiB string) and what is built from them. Measured
/// on gzip-bombed AdmissionReviews padded by an annotation: about 2.5 (BENCHMARKS.md).
pub(crate) const ADMISSION_BYTES_PER_BODY_BYTE: usize = 3;
/// Bytes of body buffers one connection may hold at once: one full-size AdmissionReview being
/// answered (or three being read), or many ordinary ones multiplexed on one HTTP/2 connection
/// (the API server's way).
pub(crate) const CONNECTION_BODY_BUDGET: usize = ADMISSION_BYTES_PER_BODY_BYTE * MAX_BODY_BYTES;
/// Bytes of body buffers the whole process may hold at once, well inside the shipped
/// Deployment's 128 MiB memory limit (bodies are parsed into more memory than they take); the
/// reserve included.
pub(crate) const PROCESS_BODY_BUDGET: usize = 16 * MAX_BODY_BYTES;
/// Of [`PROCESS_BODY_BUDGET`], what only connections that have had an admission answered may
/// use: one full-size admission being answered, and a few ordinary ones.
pub(crate) const SERVING_RESERVE: usize = 4 * MAX_BODY_BYTES;
/// What all connections from one peer address may hold of the rest: half of it, so one client
/// (however many connections it opens) leaves the other half to everyone else.
pub(crate) const PEER_BODY_SHARE: usize = (PROCESS_BODY_BUDGET - SERVING_RESERVE) / 2;
/// First capacity of a body (and of an inflated one): what an ordinary AdmissionReview needs.
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

/// The process's body budget: the part anyone may use, the serving connections' reserve, and
/// each peer address's share.
#[derive(Debug)]
pub(crate) struct BodyBudgets {
    open: ByteBudget,
    reserve: ByteBudget,
    peer_share: usize,
    /// One share per peer address with a connection open (dead entries pruned as it grows).
    peers: Mutex<Peers>,
    /// Body reads that may be evicted.
    flights: Flights,
}

#[derive(Debug, Default)]
struct Peers {
    shares: HashMap<IpAddr, Weak<ByteBudget>>,
    /// Prune dead entries when the map reaches this size.
    prune_at: usize,
}

impl BodyBudgets {
    pub(crate) fn new(limit: usize, reserve: usize, peer_share: usize) -> Self {
        Self {
            open: ByteBudget::new(limit.saturating_sub(reserve)),
            reserve: ByteBudget::new(reserve),
            peer_share,
            peers: Mutex::default(),
            flights: Flights::default(),
        }
    }

    /// The shipped budgets.
    pub(crate) fn shipped() -> Self {
        Self::new(PROCESS_BODY_BUDGET, SERVING_RESERVE, PEER_BODY_SHARE)
    }

    /// Bytes reserved now, the reserve's included.
    pub(crate) fn used(&self) -> usize {
        self.open.used() + self.reserve.used()
    }

    /// What the peers holding bodies hold on average, `newcomer` counted among them.
    fn peer_average(&self, newcomer: &Arc<ByteBudget>) -> usize {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let (mut total, mut holding) = (newcomer.used(), 1);
        for share in peers.shares.values().filter_map(Weak::upgrade) {
            if !Arc::ptr_eq(&share, newcomer) && share.used() > 0 {
                total += share.used();
                holding += 1;
            }
        }
        total / holding
    }

    /// `peer`'s share, the same for all its connections (taken once per connection).
    pub(crate) fn peer(&self, peer: IpAddr) -> Arc<ByteBudget> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(share) = peers.shares.get(&peer).and_then(Weak::upgrade) {
            return share;
        }
        if peers.shares.len() >= peers.prune_at {
            peers.shares.retain(|_, share| share.strong_count() > 0);
            peers.prune_at = (2 * peers.shares.len()).max(64);
        }
        let share = Arc::new(ByteBudget::new(self.peer_share));
        peers.shares.insert(peer, Arc::downgrade(&share));
        share
    }
}

/// Which budget refused a reservation (`tolerable_body_refusals_total`'s `budget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    Connection,
    Peer,
    Process,
}

impl Refused {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Connection => "connection",
            Self::Peer => "peer",
            Self::Process => "process",
        }
    }
}

/// Bytes held from the budgets; given back when dropped, so it must live as long as the
/// buffer it pays for.
#[derive(Debug)]
pub(crate) struct Reservation {
    connection: Arc<ByteBudget>,
    peer: Arc<ByteBudget>,
    process: Arc<BodyBudgets>,
    /// The connection has had an admission answered: it may draw on the reserve.
    serving: bool,
    bytes: usize,
    /// Of `bytes`, those drawn from the reserve (not from the peer's share and the open part).
    from_reserve: usize,
    /// The budget that last refused it, if one did.
    refused: Option<Refused>,
    /// Its body read, once tracked for eviction (until read to its end).
    flight: Option<Arc<Flight>>,
    /// Its body read was evicted (and gave back what it held).
    evicted: bool,
}

impl Reservation {
    pub(crate) fn new(
        connection: Arc<ByteBudget>,
        peer: Arc<ByteBudget>,
        process: Arc<BodyBudgets>,
        serving: bool,
    ) -> Self {
        Self {
            connection,
            peer,
            process,
            serving,
            bytes: 0,
            from_reserve: 0,
            refused: None,
            flight: None,
            evicted: false,
        }
    }

    /// Whether its body read was evicted to make room for another.
    pub(crate) fn evicted(&self) -> bool {
        self.evicted
    }

    /// The budget that refused it, if one did (a body refused and then read to its end, or cut
    /// off by the deadline meanwhile, still counts as refused).
    pub(crate) fn refused(&self) -> Option<Refused> {
        self.refused
    }

    /// Raises the reservation to `total` bytes; which budget refused (and nothing taken) when
    /// one is exhausted.
    fn grow_to(&mut self, total: usize) -> Result<(), Refused> {
        let extra = total.saturating_sub(self.bytes);
        if extra == 0 {
            return Ok(());
        }
        if !self.connection.try_take(extra) {
            return Err(Refused::Connection);
        }
        let refused = if !self.peer.try_take(extra) {
            Refused::Peer
        } else if !self.process.open.try_take(extra) {
            self.peer.give_back(extra);
            Refused::Process
        } else {
            self.set_bytes(total);
            return Ok(());
        };
        if self.serving && self.process.reserve.try_take(extra) {
            self.from_reserve += extra;
            self.set_bytes(total);
            return Ok(());
        }
        self.connection.give_back(extra);
        self.refused = Some(refused);
        Err(refused)
    }

    fn set_bytes(&mut self, total: usize) {
        self.bytes = total;
        if let Some(flight) = &self.flight {
            flight.set_held(total);
        }
    }

    /// Raises the reservation to `total` bytes, evicting stalled body reads when the process
    /// budget (and for a serving connection the reserve) is spent, and waiting for them to give
    /// their memory back: memory is taken only once it is free. `BodyError::Evicted` when this
    /// read is evicted meanwhile.
    async fn take(&mut self, total: usize) -> Result<(), BodyError> {
        let process = self.process.clone();
        let flights = &process.flights;
        loop {
            // Enabled before trying, so a victim giving back after the try wakes it.
            let mut freed = std::pin::pin!(flights.freed());
            freed.as_mut().enable();
            let refused = match self.grow_to(total) {
                Ok(()) => {
                    // Room was made: not a refusal.
                    self.refused = None;
                    return Ok(());
                }
                Err(refused) => refused,
            };
            // A peer past its share pays for it itself; a serving connection refused there
            // was refused by the reserve as well.
            let contended =
                refused == Refused::Process || (self.serving && refused == Refused::Peer);
            if !contended {
                return Err(BodyError::OverBudget(refused));
            }
            // So does a peer holding more than the others (see `flights`).
            let average = process.peer_average(&self.peer);
            if self.peer.used() >= average {
                return Err(BodyError::OverBudget(refused));
            }
            flights.evict(self.flight.as_ref(), average);
            if flights.pending() == 0 {
                return Err(BodyError::OverBudget(refused));
            }
            match self.flight.clone() {
                Some(own) => tokio::select! {
                    () = &mut freed => {}
                    () = own.evicted() => return Err(BodyError::Evicted),
                },
                None => freed.await,
            }
        }
    }

    /// Raises the reservation to cover an admission of a `body_len`-byte body being answered
    /// ([`ADMISSION_BYTES_PER_BODY_BYTE`]), evicting stalled body reads if need be (see
    /// [`Self::take`]); which budget refused (and nothing more taken) when one is exhausted.
    pub(crate) async fn cover_admission(&mut self, body_len: usize) -> Result<(), Refused> {
        let needed = ADMISSION_BYTES_PER_BODY_BYTE * body_len;
        match self.take(needed.max(self.bytes)).await {
            Ok(()) => Ok(()),
            Err(BodyError::OverBudget(refused)) => Err(refused),
            // Its body is read: it is not tracked, so not evicted.
            Err(_) => Err(Refused::Process),
        }
    }

    /// Tracks its body read for eviction (it has had to wait for bytes).
    fn track(&mut self, window: Window, ceiling: usize, received: usize) -> Arc<Flight> {
        let flights = &self.process.flights;
        let flight = flights.track(window, (ceiling, self.peer.clone()), received);
        flight.set_held(self.bytes);
        self.flight = Some(flight.clone());
        flight
    }

    /// Its body is read to its end: no longer evictable. `Evicted` if it was first.
    fn finish(&mut self) -> Result<(), BodyError> {
        match &self.flight {
            Some(flight) if !flight.finish() => Err(BodyError::Evicted),
            _ => {
                self.flight = None;
                Ok(())
            }
        }
    }

    /// Lowers the reservation to `total` bytes (a buffer it paid for was freed); what came from
    /// the reserve goes back first.
    fn shrink_to(&mut self, total: usize) {
        let freed = self.bytes.saturating_sub(total);
        let reserved = freed.min(self.from_reserve);
        self.process.reserve.give_back(reserved);
        self.peer.give_back(freed - reserved);
        self.process.open.give_back(freed - reserved);
        self.connection.give_back(freed);
        self.from_reserve -= reserved;
        self.set_bytes(self.bytes - freed);
        if self.bytes == 0 && self.flight.as_ref().is_some_and(|f| f.is_evicted()) {
            // Evicted, and all given back: the newcomers waiting for it may take it.
            self.flight = None;
            self.evicted = true;
            self.process.flights.released();
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.shrink_to(0);
    }
}

/// Why a body was not read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BodyError {
    TooLarge,
    /// A memory budget is exhausted: the server is busy, the client may retry.
    OverBudget(Refused),
    /// The body stalled, or came too slowly to be read by its deadline, while others needed
    /// the memory it held.
    Evicted,
    Unreadable(String),
    /// `Content-Encoding: gzip`, but not gzip.
    NotGzip(String),
}

/// Reads `body` into one buffer. `declared` is its `Content-Length`; `window` when its request
/// began and its read deadline (the caller bounds the time). `drain_refused`: a body refused
/// for memory (or evicted) is read to its end (and dropped) first — an HTTP/2 stream's, whose
/// client would otherwise keep sending DATA on a reset stream.
pub(crate) async fn read(
    mut body: Incoming,
    declared: Option<u64>,
    reservation: &mut Reservation,
    drain_refused: bool,
    window: Window,
) -> Result<Bytes, BodyError> {
    let ceiling = match declared {
        Some(n) if n > MAX_BODY_BYTES as u64 => return Err(BodyError::TooLarge),
        Some(n) => n as usize,
        None => MAX_BODY_BYTES,
    };
    let mut buffer = Vec::new();
    let read = async {
        let pace = (window, ceiling);
        while let Some(frame) = next_frame(&mut body, reservation, pace, buffer.len()).await? {
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let needed = buffer.len() + data.len();
            // A declared length bounds the buffer, never the reservation ahead of the bytes: a
            // client that declares 3 MiB and sends 10 bytes holds 16 KiB (or what it declared,
            // when less). One that sends more than it declared gets hyper's error.
            let capacity = needed
                .max(buffer.capacity() * 2)
                .max(INITIAL_CAPACITY)
                .min(ceiling.max(needed));
            if let Some(total) = growth(buffer.capacity(), needed, capacity, reservation)? {
                reservation.take(total).await?;
                buffer.reserve_exact(capacity - buffer.len());
            }
            buffer.extend_from_slice(&data);
            if let Some(flight) = &reservation.flight {
                flight.arrived(buffer.len());
            }
        }
        reservation.finish()
    };
    match read.await {
        Ok(()) => Ok(Bytes::from(buffer)),
        Err(e @ (BodyError::OverBudget(_) | BodyError::Evicted)) if drain_refused => {
            drop(buffer);
            reservation.shrink_to(0);
            while let Some(frame) = body.frame().await {
                frame.map_err(|e| BodyError::Unreadable(e.to_string()))?;
            }
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// The body's next frame. A read that has to wait for it is tracked for eviction from then on
/// (`pace`: its window and what its body may grow to; `received` so far), and ends as
/// `Evicted` when evicted meanwhile; one whose bytes are already there is not (no lock, no
/// clock: the ordinary admission's path).
async fn next_frame(
    body: &mut Incoming,
    reservation: &mut Reservation,
    (window, ceiling): (Window, usize),
    received: usize,
) -> Result<Option<hyper::body::Frame<Bytes>>, BodyError> {
    let unreadable = |e: hyper::Error| BodyError::Unreadable(e.to_string());
    let mut next = std::pin::pin!(body.frame());
    let flight = match &reservation.flight {
        Some(flight) if flight.is_evicted() => return Err(BodyError::Evicted),
        Some(flight) => flight.clone(),
        None => {
            let polled = std::future::poll_fn(|cx| Poll::Ready(next.as_mut().poll(cx))).await;
            if let Poll::Ready(frame) = polled {
                return frame.transpose().map_err(unreadable);
            }
            reservation.track(window, ceiling, received)
        }
    };
    tokio::select! {
        () = flight.evicted() => Err(BodyError::Evicted),
        frame = next => frame.transpose().map_err(unreadable),
    }
}

/// What the reservation must grow to for a buffer of capacity `has` to hold `needed` bytes in
/// all, growing to `capacity` (`None`: it has room).
fn growth(
    has: usize,
    needed: usize,
    capacity: usize,
    reservation: &Reservation,
) -> Result<Option<usize>, BodyError> {
    if needed > MAX_BODY_BYTES {
        return Err(BodyError::TooLarge);
    }
    if needed <= has {
        return Ok(None);
    }
    // The reservation pays for what is held besides this buffer too (the compressed body).
    let others = reservation.bytes.saturating_sub(has);
    Ok(Some(others + capacity))
}

/// Makes room in `buffer` for `needed` bytes in all, growing it to `capacity` when it must grow,
/// once the reservation pays for it (no eviction: for the inflated copy of a body read whole).
fn grow(
    buffer: &mut Vec<u8>,
    needed: usize,
    capacity: usize,
    reservation: &mut Reservation,
) -> Result<(), BodyError> {
    if let Some(total) = growth(buffer.capacity(), needed, capacity, reservation)? {
        reservation.grow_to(total).map_err(BodyError::OverBudget)?;
        buffer.reserve_exact(capacity - buffer.len());
    }
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

    fn budgets(limit: usize, reserve: usize, peer_share: usize) -> Arc<BodyBudgets> {
        Arc::new(BodyBudgets::new(limit, reserve, peer_share))
    }

    fn reservation(
        connection: &Arc<ByteBudget>,
        process: &Arc<BodyBudgets>,
        peer: IpAddr,
        serving: bool,
    ) -> Reservation {
        Reservation::new(
            connection.clone(),
            process.peer(peer),
            process.clone(),
            serving,
        )
    }

    const ONE: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
    const TWO: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

    #[test]
    fn reservations_draw_from_every_budget_and_give_back_on_drop() {
        let connection = Arc::new(ByteBudget::new(100));
        let process = budgets(150, 0, 150);
        let mut a = reservation(&connection, &process, ONE, false);
        assert_eq!(a.grow_to(60), Ok(()));
        assert_eq!(a.grow_to(100), Ok(()));
        assert_eq!(a.grow_to(101), Err(Refused::Connection));
        assert_eq!((connection.used(), process.used()), (100, 100));

        let other = Arc::new(ByteBudget::new(100));
        let mut b = reservation(&other, &process, TWO, false);
        assert_eq!(b.grow_to(60), Err(Refused::Process));
        assert_eq!(other.used(), 0, "a refused reservation takes nothing");
        assert_eq!(process.peer(TWO).used(), 0, "nor from the peer's share");
        assert_eq!(b.grow_to(50), Ok(()));
        drop(a);
        assert_eq!((connection.used(), process.used()), (0, 50));
        drop(b);
        assert_eq!((other.used(), process.used()), (0, 0));
    }

    /// Issue 34: one peer's connections hold at most its share, and only a connection that has
    /// had an admission answered draws on the reserve, whoever holds the rest.
    #[test]
    fn a_peer_holds_its_share_and_serving_connections_keep_the_reserve() {
        let process = budgets(100, 20, 50);
        let connection = || Arc::new(ByteBudget::new(100));
        let (c1, c2, c3) = (connection(), connection(), connection());
        let mut first = reservation(&c1, &process, ONE, false);
        assert_eq!(first.grow_to(50), Ok(()));
        let mut second = reservation(&c2, &process, ONE, false);
        assert_eq!(second.grow_to(1), Err(Refused::Peer), "one peer, one share");
        let mut other = reservation(&c3, &process, TWO, false);
        assert_eq!(other.grow_to(30), Ok(()), "another peer has its own");
        assert_eq!(other.grow_to(31), Err(Refused::Process), "80 of 80 open");
        // The open part and the peer's share are spent; a serving connection still gets the
        // reserve, and gives it back first.
        let c4 = connection();
        let mut serving = reservation(&c4, &process, ONE, true);
        assert_eq!(serving.grow_to(20), Ok(()));
        assert_eq!(serving.grow_to(21), Err(Refused::Peer));
        assert_eq!(process.used(), 100);
        drop(first);
        assert_eq!(serving.grow_to(30), Ok(()), "room in the share again");
        serving.shrink_to(10);
        assert_eq!((serving.from_reserve, process.reserve.used()), (0, 0));
        assert_eq!(process.peer(ONE).used(), 10);
        drop((second, other, serving));
        assert_eq!(process.used(), 0);
        assert_eq!(process.peer(ONE).used(), 0);
        assert_eq!(c4.used(), 0);
    }

    #[test]
    fn peer_shares_are_one_per_address_and_pruned_when_unused() {
        let process = budgets(100, 0, 10);
        let held = process.peer(ONE);
        assert!(Arc::ptr_eq(&held, &process.peer(ONE)));
        for last in 0..=255u8 {
            drop(process.peer(IpAddr::from([10, 0, 0, last])));
        }
        let peers = process.peers.lock().unwrap();
        assert!(peers.shares.len() <= 128, "{}", peers.shares.len());
        assert!(peers.shares.contains_key(&ONE), "a held share is kept");
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
        process: &Arc<BodyBudgets>,
    ) -> Reservation {
        let mut reservation = reservation(connection, process, ONE, false);
        assert_eq!(reservation.grow_to(compressed.len()), Ok(()));
        reservation
    }

    #[test]
    fn inflated_bytes_are_reserved_as_they_grow() {
        let (connection, process) = (
            Arc::new(ByteBudget::new(CONNECTION_BODY_BUDGET)),
            Arc::new(BodyBudgets::shipped()),
        );
        // A bomb: 3 MiB of spaces in about 3 KB.
        let bomb = gzip(&vec![b' '; MAX_BODY_BYTES]);
        assert!(bomb.len() < 4 << 10, "{}", bomb.len());
        let mut reservation = reserved_for(&bomb, &connection, &process);
        let inflated = inflate(bomb, &mut reservation).unwrap();
        assert_eq!(inflated.len(), MAX_BODY_BYTES);
        // The inflated copy is what is held now, in every budget; the compressed one is freed.
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
            BodyError::OverBudget(Refused::Connection)
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
