//! Prometheus metrics through one registry per server (the `prometheus`
//! crate): every metric of a worker or router is registered in its
//! [`Registry`] and `GET /metrics` is that registry's classic text
//! exposition ([`encode`]). The crate does the text format, label escaping
//! (`\`, `"`, newlines), histograms and their buckets.
//!
//! Two additions of ours:
//! - [`DeclaredOrder`]: the crate sorts a sample's label names; the
//!   exposition keeps them in the order declared (`{worker=..,status=..}`),
//!   as it always was and as text-matching scrapers and tests expect.
//! - [`ScrapeTime`]: families whose values are read from state owned
//!   elsewhere (engine stats, admission slots, peers) when scraped.

use std::collections::HashMap;

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, LabelPair, MetricFamily, MetricType};
use prometheus::{GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The exposition of everything registered in `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = TextEncoder::new().encode_utf8(&registry.gather(), &mut out) {
        tracing::error!(error = %e, "cannot encode the metrics");
    }
    out
}

/// A collector whose samples carry their labels in the declared order.
pub struct DeclaredOrder<C> {
    inner: C,
    order: Vec<String>,
}

impl<C: Collector> Collector for DeclaredOrder<C> {
    fn desc(&self) -> Vec<&Desc> {
        self.inner.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families = self.inner.collect();
        for metric in families.iter_mut().flat_map(|f| f.mut_metric().iter_mut()) {
            let mut labels = metric.take_label();
            labels.sort_by_key(|l| self.order.iter().position(|n| n == l.name()));
            metric.set_label(labels);
        }
        families
    }
}

/// Registers `collector`; a name registered twice or an invalid one is a
/// bug of this crate, caught by every test that builds a server.
fn register(registry: &Registry, collector: impl Collector + 'static) {
    registry.register(Box::new(collector)).expect("metric names are valid and registered once");
}

/// A counter with labels (named in the order they are exposed).
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let v = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    register(registry, DeclaredOrder { inner: v.clone(), order: labels.iter().map(|l| l.to_string()).collect() });
    v
}

pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    let c = IntCounter::new(name, help).expect("valid metric");
    register(registry, c.clone());
    c
}

/// A gauge with labels (named in the order they are exposed).
pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let v = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    register(registry, DeclaredOrder { inner: v.clone(), order: labels.iter().map(|l| l.to_string()).collect() });
    v
}

/// A histogram with these bucket upper bounds (`+Inf` implied).
pub fn histogram(registry: &Registry, name: &str, help: &str, buckets: &[f64]) -> Histogram {
    let h = Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec())).expect("valid metric");
    register(registry, h.clone());
    h
}

/// A family read at scrape time: name, help, counter or gauge, label names.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricType,
    pub labels: &'static [&'static str],
}

impl Family {
    pub const fn counter(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Self { name, help, kind: MetricType::COUNTER, labels }
    }

    pub const fn gauge(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Self {
        Self { name, help, kind: MetricType::GAUGE, labels }
    }
}

/// The samples one scrape reads, family by family.
pub struct Scrape<'a> {
    families: &'a [Family],
    out: Vec<MetricFamily>,
}

impl Scrape<'_> {
    /// One sample of the family `name` (one of the collector's families),
    /// with its label values in the family's label order.
    pub fn sample(&mut self, name: &str, label_values: &[&str], value: f64) {
        let Some(i) = self.families.iter().position(|f| f.name == name) else {
            debug_assert!(false, "{name} is not a family of this collector");
            return;
        };
        let family = &self.families[i];
        debug_assert_eq!(family.labels.len(), label_values.len(), "{name}: label values");
        let mut metric = proto::Metric::from_label(
            family
                .labels
                .iter()
                .zip(label_values)
                .map(|(n, v)| {
                    let mut l = LabelPair::default();
                    l.set_name(n.to_string());
                    l.set_value(v.to_string());
                    l
                })
                .collect(),
        );
        if family.kind == MetricType::COUNTER {
            let mut c = proto::Counter::default();
            c.set_value(value);
            metric.set_counter(c);
        } else {
            let mut g = proto::Gauge::default();
            g.set_value(value);
            metric.set_gauge(g);
        }
        self.out[i].mut_metric().push(metric);
    }
}

/// Families whose values `read` gives at each scrape.
pub struct ScrapeTime<F> {
    families: Vec<Family>,
    descs: Vec<Desc>,
    read: F,
}

impl<F: Fn(&mut Scrape) + Send + Sync + 'static> ScrapeTime<F> {
    pub fn register(registry: &Registry, families: &[Family], read: F) {
        let descs = families
            .iter()
            .map(|f| {
                let labels = f.labels.iter().map(|l| l.to_string()).collect();
                Desc::new(f.name.to_string(), f.help.to_string(), labels, HashMap::new()).expect("valid metric")
            })
            .collect();
        register(registry, Self { families: families.to_vec(), descs, read });
    }
}

impl<F: Fn(&mut Scrape) + Send + Sync> Collector for ScrapeTime<F> {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let out = self
            .families
            .iter()
            .map(|f| {
                let mut m = MetricFamily::default();
                m.set_name(f.name.to_string());
                m.set_help(f.help.to_string());
                m.set_field_type(f.kind);
                m
            })
            .collect();
        let mut scrape = Scrape { families: &self.families, out };
        (self.read)(&mut scrape);
        scrape.out.into_iter().filter(|f| !f.get_metric().is_empty()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_keep_their_declared_order_and_values_are_escaped() {
        let r = Registry::new();
        let c = counter_vec(&r, "x_total", "help", &["worker", "status"]);
        c.with_label_values(&["http://a\"b\\c\nd", "200"]).inc_by(2);
        let text = encode(&r);
        assert!(text.lines().any(|l| l == "x_total{worker=\"http://a\\\"b\\\\c\\nd\",status=\"200\"} 2"), "{text}");
        assert!(text.contains("# TYPE x_total counter"), "{text}");
    }

    #[test]
    fn scrape_time_families_are_read_at_each_scrape() {
        const FAMILIES: &[Family] = &[Family::gauge("g", "a gauge", &["tier", "reason"]), Family::counter("c_total", "a counter", &[])];
        let r = Registry::new();
        let n = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
        let read = n.clone();
        ScrapeTime::register(&r, FAMILIES, move |s| {
            s.sample("g", &["host", "full"], 0.5);
            s.sample("c_total", &[], read.load(std::sync::atomic::Ordering::Relaxed) as f64);
        });
        assert!(encode(&r).contains("g{tier=\"host\",reason=\"full\"} 0.5\n"));
        n.store(7, std::sync::atomic::Ordering::Relaxed);
        let text = encode(&r);
        assert!(text.lines().any(|l| l == "c_total 7"), "{text}");
        assert!(text.contains("# HELP c_total a counter\n# TYPE c_total counter\n"), "{text}");
    }
}
