//! Istio: one `VirtualService` (`networking.istio.io/v1`) per model, one
//! HTTP route weighting the live revisions' Services by host in whole
//! percent (Istio's unit: the weights add up to 100), every request
//! mirrored when the data plane declares a mirror. In force when istiod
//! reports the object's generation (`status.observedGeneration`, written
//! when istiod's status reporting is on).

use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use rollgate_store::MirrorTo;
use serde_json::{Value, json};

use super::{Service, Shape, fill};
use crate::{AdapterError, Desired};

/// An Istio data plane's virtual services.
#[derive(Debug)]
pub(crate) struct VirtualServices {
    /// The object's name (`$model` filled in).
    pub name: String,
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
    pub mirror: Option<MirrorTo>,
}

impl Shape for VirtualServices {
    fn kind(&self) -> &'static str {
        "istio"
    }

    fn resource(&self) -> ApiResource {
        ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "VirtualService"),
            "virtualservices",
        )
    }

    fn objects(&self, desired: &Desired) -> Result<Vec<(String, Value)>, AdapterError> {
        let live: Vec<_> = desired.arms.iter().filter(|a| a.weight_bp > 0).collect();
        let percents = percents(&live.iter().map(|a| a.weight_bp).collect::<Vec<_>>());
        let mut routes = Vec::with_capacity(live.len());
        for (arm, percent) in live.iter().zip(percents) {
            let service = Service::of(&arm.upstream)?;
            routes.push(json!({
                "destination": { "host": service.mesh_host(), "port": { "number": service.port } },
                "weight": percent,
            }));
        }
        let mut http = json!({ "name": "rollgate", "route": routes });
        if let Some(m) = &self.mirror {
            http["mirror"] = json!({ "host": m.service, "port": { "number": m.port } });
            http["mirrorPercentage"] = json!({ "value": 100.0 });
        }
        let model = &desired.model;
        let mut spec = json!({
            "hosts": self.hosts.iter().map(|h| fill(h, model)).collect::<Vec<_>>(),
            "http": [http],
        });
        if !self.gateways.is_empty() {
            spec["gateways"] = json!(self.gateways);
        }
        Ok(vec![(fill(&self.name, model), spec)])
    }

    fn in_force(&self, object: &DynamicObject, generation: i64) -> Result<(), String> {
        let status = &object.data["status"];
        // Its analysis may find the object wrong (a host it cannot
        // resolve): an error it reports is not a routing in force.
        let mut errors = status["validationMessages"]
            .as_array()
            .into_iter()
            .flatten();
        if let Some(message) = errors.find(|m| m["level"] == "ERROR") {
            return Err(format!("istiod reports an error: {message}"));
        }
        let mut conditions = status["conditions"].as_array().into_iter().flatten();
        if let Some(c) = conditions.find(|c| c["type"] == "Reconciled" && c["status"] != "True") {
            return Err(format!(
                "istiod reports Reconciled {}: {}",
                c["status"],
                c["message"].as_str().unwrap_or_default()
            ));
        }
        // istiod writes it as a number or, through protobuf's JSON, a string.
        let observed = &status["observedGeneration"];
        let observed = observed
            .as_i64()
            .or_else(|| observed.as_str()?.parse().ok());
        match observed {
            Some(g) if g >= generation => Ok(()),
            Some(g) => Err(format!(
                "istiod reports generation {g}, not yet {generation}"
            )),
            None => Err(
                "istiod reports no status (is its status reporting on? else set require_status = false)"
                    .into(),
            ),
        }
    }
}

/// Basis points (of live arms) as whole percents adding up to 100: each
/// rounded to the nearest, a live arm never below 1%, the first arm (the
/// champion) taking what rounding left over, and at least 1% itself.
fn percents(bp: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = bp.iter().map(|b| ((b + 50) / 100).max(1)).collect();
    if let Some((first, rest)) = out.split_first_mut() {
        // Room for the first: take it from the largest of the others.
        while rest.iter().sum::<u32>() > 99 {
            match rest.iter_mut().max() {
                Some(largest) if *largest > 1 => *largest -= 1,
                _ => break,
            }
        }
        *first = 100u32.saturating_sub(rest.iter().sum());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::percents;

    #[test]
    fn weights_in_percent_add_up_to_100() {
        assert_eq!(percents(&[10_000]), vec![100]);
        assert_eq!(percents(&[9_500, 500]), vec![95, 5]);
        assert_eq!(percents(&[7_500, 2_500]), vec![75, 25]);
        assert_eq!(
            percents(&[9_990, 10]),
            vec![99, 1],
            "a live candidate keeps 1%"
        );
        assert_eq!(percents(&[9_949, 51]), vec![99, 1]);
        assert_eq!(percents(&[50, 9_950]), vec![1, 99], "the champion keeps 1%");
        assert_eq!(percents(&[100, 9_850, 50]), vec![1, 98, 1]);
        for c in 1..10_000 {
            let p = percents(&[10_000 - c, c]);
            assert_eq!(p.iter().sum::<u32>(), 100, "{c}");
            assert!(p[1] >= 1 && p[0] >= 1, "{c}: {p:?}");
        }
    }
}
