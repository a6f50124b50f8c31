//! Which Kubernetes Service a revision's upstream names. A revision
//! routed by a Kubernetes data plane registers the in-cluster URL of its
//! Service, the URL rollgate's gateway and probes reach it at too:
//! `http://NAME[.NAMESPACE[.svc[.CLUSTER-DOMAIN]]][:PORT]`.

use rollgate_store::is_dns_label;

use crate::AdapterError;

/// A Service, as a revision's upstream URL names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    pub name: String,
    /// Absent: the routing object's own namespace.
    pub namespace: Option<String>,
    pub port: u16,
    /// The URL's host as written (what Istio routes to).
    pub host: String,
}

impl Service {
    /// The Service `upstream` names, or why it names none.
    pub fn of(upstream: &str) -> Result<Service, AdapterError> {
        let unroutable = |why: &str| AdapterError::Unroutable {
            upstream: upstream.to_string(),
            why: format!(
                "{why}; a Kubernetes data plane routes to Services: register the revision \
                 at its Service's URL, e.g. http://fraud-v2.models.svc:8080"
            ),
        };
        let (rest, default_port) = if let Some(r) = upstream.strip_prefix("http://") {
            (r, 80)
        } else if let Some(r) = upstream.strip_prefix("https://") {
            (r, 443)
        } else {
            return Err(unroutable("not an http(s):// URL"));
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        if authority.contains('@') || authority.starts_with('[') {
            return Err(unroutable("not a Service's host"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h,
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| unroutable("its port is not a port"))?,
            ),
            None => (authority, default_port),
        };
        let labels: Vec<&str> = host.split('.').collect();
        let service_shaped = labels.iter().all(|l| is_dns_label(l))
            && match labels.len() {
                1 | 2 => true,
                _ => labels[2] == "svc",
            };
        let first = labels.first().copied().unwrap_or_default();
        if !service_shaped || first.parse::<u8>().is_ok() {
            return Err(unroutable(&format!("{host:?} is not a Service's name")));
        }
        Ok(Service {
            name: first.to_string(),
            namespace: labels.get(1).map(|s| s.to_string()),
            port,
            host: host.to_string(),
        })
    }

    /// The host Istio routes to for this Service: Istio reads a host with
    /// a dot as a full name, so `NAME.NS` and `NAME.NS.svc` are completed
    /// with the cluster domain (`cluster.local` unless the URL names
    /// one); a bare `NAME` stays short (the VirtualService's namespace).
    pub fn mesh_host(&self) -> String {
        match self.host.split('.').count() {
            1 => self.host.clone(),
            2 => format!("{}.svc.cluster.local", self.host),
            3 => format!("{}.cluster.local", self.host),
            _ => self.host.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_url_names_its_service() {
        for (url, name, ns, port) in [
            ("http://fraud-v2:8080", "fraud-v2", None, 8080),
            (
                "http://fraud-v2.models:8080/",
                "fraud-v2",
                Some("models"),
                8080,
            ),
            ("http://fraud-v2.models.svc", "fraud-v2", Some("models"), 80),
            (
                "https://fraud-v2.models.svc.cluster.local/v2",
                "fraud-v2",
                Some("models"),
                443,
            ),
            ("http://localhost:9000", "localhost", None, 9000),
        ] {
            let s = Service::of(url).expect(url);
            assert_eq!(
                (s.name.as_str(), s.namespace.as_deref(), s.port),
                (name, ns, port),
                "{url}"
            );
        }
    }

    #[test]
    fn istio_gets_a_full_name_or_a_short_one() {
        for (url, host) in [
            ("http://fraud-v2:8080", "fraud-v2"),
            (
                "http://fraud-v2.models:8080",
                "fraud-v2.models.svc.cluster.local",
            ),
            (
                "http://fraud-v2.models.svc",
                "fraud-v2.models.svc.cluster.local",
            ),
            (
                "http://fraud-v2.models.svc.corp.example",
                "fraud-v2.models.svc.corp.example",
            ),
        ] {
            assert_eq!(Service::of(url).expect(url).mesh_host(), host, "{url}");
        }
    }

    #[test]
    fn what_names_no_service_is_unroutable() {
        for url in [
            "http://127.0.0.1:8080",
            "http://[::1]:8080",
            "http://models.example.com:8080",
            "http://Fraud:8080",
            "http://fraud:0",
            "http://fraud:http",
            "unix:/run/model.sock",
            "http://user@fraud:80",
        ] {
            assert!(
                matches!(Service::of(url), Err(AdapterError::Unroutable { .. })),
                "{url}"
            );
        }
    }
}
