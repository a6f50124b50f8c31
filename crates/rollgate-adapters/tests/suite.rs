//! Every adapter passes the kit (`rollgate_adapters::kit`) against its
//! real peer on 127.0.0.1. A new adapter adds its module here.

mod envoy;
mod gateway_api;
mod istio;
mod kserve;
mod nginx;
mod webhook;
