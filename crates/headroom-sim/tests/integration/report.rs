//! Snapshots of the table and the HTML page, on a small comparison worked out by the simulator.

use headroom_sim::{
    compare, report, JobKind, Machine, PolicySpec, SimConfig, Trace, TraceJob, Workload, SCHEMA,
};

fn comparison() -> headroom_sim::Comparison {
    let jobs = (0..6)
        .map(|index| TraceJob {
            label: format!("unit{index}.o"),
            group: "g++ -O2".into(),
            kind: JobKind::Compile,
            deps: Vec::new(),
            peak: 3 << 30,
            duration: 10.0 + index as f64,
            cpu: 10.0 + index as f64,
            profile: vec![(1.0, 1 << 30), (8.0, 3 << 30), (10.0, 2 << 30)],
            input_bytes: Some(20 << 20),
        })
        .collect();
    let trace = Trace {
        schema: SCHEMA,
        name: "six <units>".into(),
        source: None,
        recorded: None,
        jobs,
    };
    let config = SimConfig::default();
    let machine: Machine = "4c/8G".parse().expect("valid machine");
    let policies: Vec<PolicySpec> = ["headroom", "headroom-warm", "static", "parallel-memfree"]
        .iter()
        .map(|name| name.parse().expect("valid policy"))
        .collect();
    compare(&Workload::new(&trace, &config), machine, &policies, &config).expect("runs")
}

#[test]
fn table_shows_each_policy_and_the_verdict() {
    insta::assert_snapshot!(report::table(&[comparison()], false));
}

#[test]
fn table_can_show_every_static_job_count() {
    let table = report::table(&[comparison()], true);
    for jobs in 1..=4 {
        assert!(table.contains(&format!("static -j{jobs} ")), "{table}");
    }
}

#[test]
fn html_is_one_self_contained_page_with_escaped_names() {
    insta::assert_snapshot!(report::html(&[comparison()]));
}
