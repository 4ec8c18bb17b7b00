//! Lists of any kind, read in pages (`limit`, then the `continue` token, as kubectl and
//! client-go's pager do), each page straight into the caller's compact projection: memory grows
//! with what the caller keeps, not with what the API server sends. A continue token that
//! expires (410) starts the list again, a few times. `audit` reads the cluster through it.

use anyhow::Context as _;
use kube::api::ListParams;
use serde::de::DeserializeOwned;
use serde::Deserialize;

/// How many times a list is started again when the API server says its continue token expired
/// (410 Gone, reason Expired: etcd compacted past the list's revision while it was paged). The
/// cluster is changing under the list; a few fresh starts is what client-go's reflector does
/// before it gives up for a while.
pub(crate) const LIST_TRIES: usize = 3;

/// One page of a list: the items as projections, and where to go on.
#[derive(Deserialize)]
struct Page<T> {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default = "Vec::new")]
    items: Vec<T>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageMeta {
    #[serde(rename = "continue")]
    continue_: Option<String>,
    remaining_item_count: Option<i64>,
}

/// Where and how to list.
pub(crate) struct Lister<'a> {
    pub(crate) client: &'a kube::Client,
    /// The namespace of namespaced kinds (`None`: all).
    pub(crate) namespace: Option<&'a str>,
    /// `limit`: items per page (kubectl's `--chunk-size`, 500 by default).
    pub(crate) page: u32,
    /// Told how the list goes: each page read, a list started again.
    pub(crate) progress: &'a (dyn Fn(&str) + Sync),
}

impl Lister<'_> {
    fn path<K>(&self) -> String
    where
        K: kube::Resource<DynamicType = ()>,
        K::Scope: 'static,
    {
        let namespaced = std::any::TypeId::of::<K::Scope>()
            == std::any::TypeId::of::<k8s_openapi::NamespaceResourceScope>();
        let namespace = if namespaced { self.namespace } else { None };
        K::url_path(&(), namespace)
    }

    /// Every item of the list of `K` (matching `selector`), each read as `T` and projected as
    /// `P`, page by page; started again from the first page when the continue token expires.
    pub(crate) async fn list<K, T, P>(
        &self,
        selector: Option<&str>,
        project: impl Fn(T) -> Option<P>,
    ) -> anyhow::Result<Vec<P>>
    where
        K: kube::Resource<DynamicType = ()>,
        K::Scope: 'static,
        T: DeserializeOwned,
    {
        let plural = K::plural(&());
        let path = self.path::<K>();
        let mut params = ListParams::default().limit(self.page);
        if let Some(selector) = selector {
            params = params.labels(selector);
        }
        for _ in 0..LIST_TRIES {
            match self.pages(&path, &plural, params.clone(), &project).await {
                Ok(items) => return Ok(items),
                Err(kube::Error::Api(status)) if status.code == 410 => {
                    (self.progress)(&format!(
                        "the API server expired the list of {plural} while it was paged ({}); listing again from the start",
                        status.reason
                    ));
                }
                Err(e) => return Err(e).with_context(|| format!("could not list {plural}")),
            }
        }
        anyhow::bail!(
            "could not list {plural}: the API server expired its continue token {LIST_TRIES} times in a row (410 Expired: the cluster changed faster than the list was read; a larger --chunk-size reads it in fewer pages)"
        )
    }

    /// One pass over the pages of a list.
    async fn pages<T, P>(
        &self,
        path: &str,
        plural: &str,
        mut params: ListParams,
        project: impl Fn(T) -> Option<P>,
    ) -> Result<Vec<P>, kube::Error>
    where
        T: DeserializeOwned,
    {
        let mut items = Vec::new();
        loop {
            let request = kube::core::Request::new(path)
                .list(&params)
                .map_err(kube::Error::BuildRequest)?;
            let page: Page<T> = self.client.request(request).await?;
            items.extend(page.items.into_iter().filter_map(&project));
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => {
                    let more = page
                        .metadata
                        .remaining_item_count
                        .map_or(String::new(), |n| format!(", {n} more"));
                    (self.progress)(&format!("{plural}: {} read{more}", items.len()));
                    params = params.continue_token(&token);
                }
                _ => return Ok(items),
            }
        }
    }
}
