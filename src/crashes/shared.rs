//! What the crash watch learned, in the shared cache (`[shared_cache] url`), so every replica's
//! admissions — and `review`, `audit`, `tolerable crashes list | forget` — see what the leader
//! learned (issue 38).
//!
//! Keys (beside the lookup cache's, under the same prefix):
//! - `tolerable:v1:learned:<digest>`: a hash, architecture → the namespace whose crash taught
//!   it; at most [`MAX_ARCHITECTURES`] fields; expires [`super::LEARNED_TTL`] after the last
//!   architecture learned;
//! - `tolerable:v1:learned-index`: a sorted set of the digests learned, by when (the server's
//!   clock, ms): at most [`super::MAX_LEARNED`], the oldest forgotten first, so a `list` or a
//!   replica's refresh reads one bounded range, never a SCAN of the keyspace;
//! - `tolerable:v1:learned-ns:<namespace>`: the same per namespace, at most
//!   [`super::MAX_PER_NAMESPACE`]: a namespace whose Pods crash by the hundred forgets its own
//!   oldest entries, not other namespaces';
//! - `tolerable:v1:learned-version`: bumped by every change, so a replica reads the index again
//!   only when something changed.
//!
//! A learn and a forget are one script each (EVAL: atomic, one round trip; the keys it derives
//! from a digest or a namespace are not declared, so a Redis Cluster is not supported — nor is
//! it by the lookup cache). Every request is bounded by [`REQUEST_TIMEOUT`]; a failure is the
//! caller's to report (the crash watch logs it and keeps what it learned in memory).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::registry::SharedCacheSettings;

/// Architectures kept per digest (a digest wrong on more than this is wrong everywhere).
pub const MAX_ARCHITECTURES: usize = 8;
/// The longest one request to the store may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const PREFIX: &str = "tolerable:v1:";

/// One learned digest as the store keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LearnedEntry {
    pub digest: String,
    /// (architecture, the namespace whose crash taught it), sorted.
    pub architectures: Vec<(String, String)>,
    /// What is left of its TTL.
    pub expires_in: Duration,
}

/// The learned store in the shared cache.
pub struct SharedLearned {
    settings: SharedCacheSettings,
    client: redis::Client,
    connection: OnceLock<Option<ConnectionManager>>,
}

/// Learns ARGV[2] (architecture) for ARGV[1] (digest), taught by namespace ARGV[3]; trims the
/// per-namespace index (that namespace's own oldest) then the index (the oldest of all).
/// KEYS: the entry, the index, the namespace's index, the version.
const LEARN: &str = r#"
local ttl = tonumber(ARGV[4])
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 0
   and redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[5]) then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZADD', KEYS[3], now, ARGV[1])
redis.call('PEXPIRE', KEYS[3], ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - ttl)
local prefix = ARGV[8]
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[6])
if over > 0 then
  for _, d in ipairs(redis.call('ZRANGE', KEYS[3], 0, over - 1)) do
    redis.call('ZREM', KEYS[3], d)
    local entry = prefix .. 'learned:' .. d
    local fields = redis.call('HGETALL', entry)
    for i = 1, #fields, 2 do
      if fields[i + 1] == ARGV[3] then redis.call('HDEL', entry, fields[i]) end
    end
    if redis.call('EXISTS', entry) == 0 then redis.call('ZREM', KEYS[2], d) end
  end
end
over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[7])
if over > 0 then
  for _, d in ipairs(redis.call('ZRANGE', KEYS[2], 0, over - 1)) do
    redis.call('ZREM', KEYS[2], d)
    redis.call('DEL', prefix .. 'learned:' .. d)
  end
end
redis.call('INCR', KEYS[4])
return 1
"#;

/// Forgets ARGV[2] (an architecture, or '' for all) of digest ARGV[1]; returns how many
/// architectures were forgotten. KEYS: the entry, the index, the version.
const FORGET: &str = r#"
local fields = redis.call('HGETALL', KEYS[1])
local removed, touched = 0, {}
for i = 1, #fields, 2 do
  if ARGV[2] == '' or ARGV[2] == fields[i] then
    redis.call('HDEL', KEYS[1], fields[i])
    touched[fields[i + 1]] = true
    removed = removed + 1
  end
end
local left = {}
for _, ns in ipairs(redis.call('HVALS', KEYS[1])) do left[ns] = true end
for ns, _ in pairs(touched) do
  if not left[ns] then redis.call('ZREM', ARGV[3] .. 'learned-ns:' .. ns, ARGV[1]) end
end
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('ZREM', KEYS[2], ARGV[1]) end
if removed > 0 then redis.call('INCR', KEYS[3]) end
return removed
"#;

fn entry_key(digest: &str) -> String {
    format!("{PREFIX}learned:{digest}")
}

fn index_key() -> String {
    format!("{PREFIX}learned-index")
}

fn namespace_key(namespace: &str) -> String {
    format!("{PREFIX}learned-ns:{namespace}")
}

fn version_key() -> String {
    format!("{PREFIX}learned-version")
}

impl SharedLearned {
    /// Checks the settings (the TLS roots parse); connects on first use.
    pub fn new(settings: SharedCacheSettings) -> Result<Self, String> {
        let client = settings.client()?;
        Ok(Self {
            settings,
            client,
            connection: OnceLock::new(),
        })
    }

    /// The URL (no password), for messages.
    pub fn url(&self) -> &str {
        self.settings.url()
    }

    /// `digest` does not run on `arch`, taught by a crash in `namespace`, for `ttl`. `false`:
    /// the digest already has [`MAX_ARCHITECTURES`] others.
    pub async fn learn(
        &self,
        namespace: &str,
        digest: &str,
        arch: &str,
        ttl: Duration,
    ) -> Result<bool, String> {
        let mut script = redis::cmd("EVAL");
        script
            .arg(LEARN)
            .arg(4)
            .arg(entry_key(digest))
            .arg(index_key())
            .arg(namespace_key(namespace))
            .arg(version_key())
            .arg(digest)
            .arg(arch)
            .arg(namespace)
            .arg(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1))
            .arg(MAX_ARCHITECTURES)
            .arg(super::MAX_PER_NAMESPACE)
            .arg(super::MAX_LEARNED)
            .arg(PREFIX);
        let learned: i64 = self.query(script).await?;
        Ok(learned == 1)
    }

    /// Forgets `arch` (every architecture for `None`) of `digest`: how many were forgotten.
    pub async fn forget(&self, digest: &str, arch: Option<&str>) -> Result<usize, String> {
        let mut script = redis::cmd("EVAL");
        script
            .arg(FORGET)
            .arg(3)
            .arg(entry_key(digest))
            .arg(index_key())
            .arg(version_key())
            .arg(digest)
            .arg(arch.unwrap_or(""))
            .arg(PREFIX);
        let removed: i64 = self.query(script).await?;
        Ok(usize::try_from(removed).unwrap_or(0))
    }

    /// The version: changes with every learn and forget (0: nothing learned yet).
    pub(crate) async fn version(&self) -> Result<i64, String> {
        let mut get = redis::cmd("GET");
        get.arg(version_key());
        let version: Option<i64> = self.query(get).await?;
        Ok(version.unwrap_or(0))
    }

    /// Every digest learned (at most [`super::MAX_LEARNED`], the newest first): the index's
    /// range, then one pipeline of each entry's fields and TTL.
    pub async fn entries(&self) -> Result<Vec<LearnedEntry>, String> {
        let mut range = redis::cmd("ZREVRANGE");
        range
            .arg(index_key())
            .arg(0)
            .arg(super::MAX_LEARNED.saturating_sub(1));
        let digests: Vec<String> = self.query(range).await?;
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for digest in &digests {
            let key = entry_key(digest);
            pipe.cmd("HGETALL").arg(&key).cmd("PTTL").arg(&key);
        }
        type Read = Vec<(BTreeMap<String, String>, i64)>;
        let read: Read = self
            .run(|mut c| async move { pipe.query_async::<Read>(&mut c).await })
            .await?;
        Ok(digests
            .into_iter()
            .zip(read)
            .filter(|(_, (fields, pttl))| !fields.is_empty() && *pttl > 0)
            .map(|(digest, (fields, pttl))| {
                let architectures = fields.into_iter().take(MAX_ARCHITECTURES).collect();
                LearnedEntry {
                    digest,
                    architectures,
                    expires_in: Duration::from_millis(pttl.unsigned_abs()),
                }
            })
            .collect())
    }

    async fn query<T: redis::FromRedisValue>(&self, command: redis::Cmd) -> Result<T, String> {
        self.run(|mut c| async move { command.query_async::<T>(&mut c).await })
            .await
    }

    /// Runs `request` within [`REQUEST_TIMEOUT`]; the error without the password.
    async fn run<T, F>(&self, request: impl FnOnce(ConnectionManager) -> F) -> Result<T, String>
    where
        F: std::future::Future<Output = redis::RedisResult<T>>,
    {
        let connection = self
            .connection()
            .ok_or_else(|| format!("{}: not usable", self.url()))?;
        match tokio::time::timeout(REQUEST_TIMEOUT, request(connection)).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.settings.scrub(&format!("{}: {e}", self.url()))),
            Err(_) => Err(format!("{}: no answer within 2s", self.url())),
        }
    }

    /// The connection, made on first use (inside the runtime); it reconnects by itself.
    fn connection(&self) -> Option<ConnectionManager> {
        self.connection
            .get_or_init(|| {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(REQUEST_TIMEOUT))
                    .set_response_timeout(Some(REQUEST_TIMEOUT))
                    .set_number_of_retries(1);
                ConnectionManager::new_lazy_with_config(self.client.clone(), config).ok()
            })
            .clone()
    }
}
