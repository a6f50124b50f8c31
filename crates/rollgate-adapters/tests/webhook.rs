//! The webhook adapter against the reference receiver (real HTTP over
//! 127.0.0.1), which refuses a lower generation as the contract asks.

use std::time::Duration;

use rollgate_adapters::kit::{self, Proxy, Receiver, Upstreams};
use rollgate_adapters::{HttpClient, for_plane};
use rollgate_store::DataPlane;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_adapter_passes_the_kit() {
    let upstreams = Upstreams::start().await;
    let receiver = Receiver::start().await;
    let plane = DataPlane::Webhook {
        url: receiver.url(),
        bearer_token_file: None,
    };
    let peer = Proxy {
        adapter: for_plane(&plane, &HttpClient::new(Duration::from_secs(2))),
        url: receiver.router_url(),
    };
    kit::run(&peer, &upstreams).await;
}
