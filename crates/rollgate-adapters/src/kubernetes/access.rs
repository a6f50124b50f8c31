//! A Kubernetes client for a data plane's `cluster` declaration, made once
//! per declaration and kept: the controller builds an adapter for every
//! apply, and a client holds its connections and its credentials.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use rollgate_store::KubeAccess;

use crate::AdapterError;

/// The clients made so far, by their declaration.
static CLIENTS: Mutex<Option<HashMap<String, Client>>> = Mutex::new(None);

/// How long a connection or one answer may take: an apply is bounded by
/// the controller too, but a confirmation's every read must end.
const CALL_WITHIN: Duration = Duration::from_secs(5);

/// The client for `access`, made on first use.
pub(crate) async fn client(access: &KubeAccess) -> Result<Client, AdapterError> {
    let key = serde_json::to_string(access).unwrap_or_default();
    if let Some(c) = CLIENTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return Ok(c.clone());
    }
    let mut config = config(access).await?;
    config.connect_timeout = Some(CALL_WITHIN);
    config.read_timeout = Some(CALL_WITHIN);
    config.write_timeout = Some(CALL_WITHIN);
    let client = Client::try_from(config)
        .map_err(|e| AdapterError::Io(format!("cannot make a Kubernetes client: {e}")))?;
    CLIENTS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, client.clone());
    Ok(client)
}

/// The client configuration `access` declares: an explicit URL (with a
/// CA file and a token file), a kubeconfig file and context, or what
/// kube infers (in-cluster, then `$KUBECONFIG` / `~/.kube/config`).
/// Also how `rollgate operator` reaches its cluster (with its own
/// timeouts: a watch waits minutes for an event).
pub async fn config(access: &KubeAccess) -> Result<Config, AdapterError> {
    let io = |what: &str, e: &dyn std::fmt::Display| {
        AdapterError::Io(format!("Kubernetes access: {what}: {e}"))
    };
    let options = KubeConfigOptions {
        context: access.context.clone(),
        ..KubeConfigOptions::default()
    };
    let mut config = match (&access.url, &access.kubeconfig) {
        (Some(url), _) => {
            let uri = url
                .parse()
                .map_err(|e| io(&format!("the url {url:?}"), &e))?;
            Config::new(uri)
        }
        (None, Some(path)) => {
            let file = Kubeconfig::read_from(path).map_err(|e| io(path, &e))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| io(path, &e))?
        }
        (None, None) if access.context.is_some() => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| io("the kubeconfig", &e))?,
        (None, None) => Config::infer()
            .await
            .map_err(|e| io("no in-cluster account and no kubeconfig", &e))?,
    };
    if let Some(ca) = &access.ca_file {
        // Read by the client itself, again when it changes (a rotated CA).
        if let Err(e) = std::fs::metadata(ca) {
            return Err(io(ca, &e));
        }
        config.root_cert_file = Some(ca.into());
    }
    if let Some(token) = &access.token_file {
        config.auth_info.token_file = Some(token.clone());
    }
    Ok(config)
}
