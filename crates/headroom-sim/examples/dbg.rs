use headroom_sched::Action;
use headroom_sim::*;
use std::path::Path;

struct Log<P: Policy> {
    inner: P,
    last_print: f64,
}

impl<P: Policy> Policy for Log<P> {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn family(&self) -> &'static str {
        self.inner.family()
    }
    fn offer(&mut self, job: &SimJob) {
        self.inner.offer(job)
    }
    fn decide(&mut self, view: &View<'_>) -> Vec<Action> {
        let a = self.inner.decide(view);
        for x in &a {
            if !matches!(x, Action::Start(_)) || std::env::var("STARTS").is_ok() {
                println!(
                    "{:8.1} {:?} used={:.1}G running={}",
                    view.now,
                    x,
                    view.used() as f64 / 1073741824.0,
                    view.running.len()
                );
            }
        }
        if view.now - self.last_print >= 10.0 {
            self.last_print = view.now;
            let s: Vec<String> = view
                .running
                .iter()
                .map(|r| format!("{}:{:.1}", r.id, r.bytes as f64 / 1073741824.0))
                .collect();
            println!(
                "{:8.1} used={:.1}G n={} [{}]",
                view.now,
                view.used() as f64 / 1073741824.0,
                view.running.len(),
                s.join(" ")
            );
        }
        a
    }
    fn finished(&mut self, job: &SimJob, peak: u64, now: f64) {
        println!(
            "{:8.1} end {} peak={:.2}G",
            now,
            job.id,
            peak as f64 / 1073741824.0
        );
        self.inner.finished(job, peak, now)
    }
    fn oom_killed(&mut self, job: &SimJob, peak: u64) {
        self.inner.oom_killed(job, peak)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let trace = Trace::load(Path::new(&args[1])).unwrap();
    let machine: Machine = args[2].parse().unwrap();
    let config = SimConfig::default();
    let workload = Workload::new(&trace, &config);
    let out = if std::env::var("CLAIR").is_ok() {
        let mut p = Log {
            inner: policy::Clairvoyant::new(machine, &workload),
            last_print: -100.0,
        };
        simulate(&workload, machine, &mut p, &config).unwrap()
    } else {
        let mut p = Log {
            inner: policy::Headroom::new(machine, &workload, true),
            last_print: -100.0,
        };
        simulate(&workload, machine, &mut p, &config).unwrap()
    };
    println!("{:?}", out);
}
