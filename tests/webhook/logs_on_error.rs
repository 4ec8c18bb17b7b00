//! `[crashes] fallback_to_logs_on_error`: a recorded Pod CREATE (its container's
//! `terminationMessagePolicy` is the `File` the API server wrote before the webhook saw it)
//! gets `FallbackToLogsOnError` in the JSON Patch with its placement, and the patched Pod
//! reinvoked gets no patch; without the key, the policy is left alone.

use serde_json::{json, Value};
use tolerable::config::Config;

use crate::common;
use common::registry;
use common::webhook::{self, recorded, TestServer};

/// The config's policy with the key set as `value` (through its environment variable, as a
/// deployment sets it) and the tests' second tainted pool.
fn policy(value: &str) -> tolerable::mutate::Policy {
    let vars = [(
        "TOLERABLE_CRASHES__FALLBACK_TO_LOGS_ON_ERROR".to_owned(),
        value.to_owned(),
    )];
    let config = Config::load(None, vars).unwrap();
    tolerable::mutate::Policy {
        supported_architectures: webhook::policy().supported_architectures,
        ..config.policy
    }
}

async fn admitted(server: &TestServer, review: &Value) -> Value {
    let (response, _) = webhook::admit(server, review, std::time::Duration::from_secs(10)).await;
    assert_eq!(response["allowed"], true, "{response}");
    response
}

#[tokio::test]
async fn the_default_policy_becomes_fallback_to_logs_on_error_once() {
    let server = TestServer::start(policy("true"), common::settings()).await;
    let request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    let containers = &request["request"]["object"]["spec"]["containers"];
    assert_eq!(containers[0]["terminationMessagePolicy"], "File");
    let response = admitted(&server, &request).await;
    let patched = webhook::patched(&request, &response);
    assert_eq!(
        patched["spec"]["containers"][0]["terminationMessagePolicy"],
        "FallbackToLogsOnError"
    );
    // The placement is there as without the key.
    assert!(
        patched["spec"]["affinity"]["nodeAffinity"].is_object(),
        "{patched:#}"
    );
    let mut again = request.clone();
    again["request"]["object"] = patched;
    let response = admitted(&server, &again).await;
    assert!(response.get("patch").is_none(), "{response}");
}

#[tokio::test]
async fn without_the_key_the_policy_is_left_alone() {
    let server = TestServer::start(policy("false"), common::settings()).await;
    let request = recorded("pod-create-simple.v1.json", &registry::plain().host);
    let response = admitted(&server, &request).await;
    let patched = webhook::patched(&request, &response);
    assert_eq!(
        patched["spec"]["containers"][0]["terminationMessagePolicy"],
        json!("File")
    );
}
