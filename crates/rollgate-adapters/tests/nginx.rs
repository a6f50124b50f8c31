//! The nginx adapter against a real nginx on 127.0.0.1 (Debian's; `CI`
//! fails without it, a local run skips), seeded by the adapter itself.

use rollgate_adapters::kit::{self, Nginx, Proxy, Upstreams};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nginx_adapter_passes_the_kit() {
    let upstreams = Upstreams::start().await;
    let Some(nginx) = Nginx::start(&upstreams.champion_url(), None) else {
        return;
    };
    let peer = Proxy {
        adapter: nginx.adapter(),
        url: format!("http://{}/", nginx.addr),
    };
    kit::run(&peer, &upstreams).await;
}
