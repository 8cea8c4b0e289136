//! Which jobs the build system offered together in the newest build. `make -j` starts a
//! burst of jobs at once, and whichever connects to the governor first would start before the
//! governor has seen the longer jobs of the same burst; a job that came first in its burst
//! waits, at most until the next sampling tick, for the longer ones its burst brought last
//! time, and a slot a job leaves waits the same way for the longer jobs that followed it.
//! (In the simulator a burst's jobs arrive together before the policy decides, so the wait
//! never holds anything there.)

use std::collections::{HashMap, HashSet};

/// How far apart, at most, the offers of one burst came in the newest build.
const BURST_MS: u64 = 50;
/// How much longer a job that is still to come must be for a free slot to wait for it: a
/// wait lasts until it comes or the sampler's next tick, so shorter differences are not
/// worth it (and builds of many small jobs never wait).
const WORTH_WAITING_SECONDS: f64 = 1.0;

/// The newest build's jobs in the order it offered them, each with when it ended and the
/// longest path from it (its own seconds and the work that waited on it).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Bursts {
    /// By offer time.
    offers: Vec<BurstOffer>,
    /// Each key's place in `offers`.
    place: HashMap<String, usize>,
}

/// One job as the newest build offered it.
#[derive(Debug, Clone, PartialEq)]
pub struct BurstOffer {
    pub key: String,
    /// Milliseconds from the build's start.
    pub offered_ms: u64,
    pub end_ms: u64,
    /// Its own seconds and the work that waited on it.
    pub path: f64,
}

impl Bursts {
    /// The bursts of the newest build's `offers`, in any order.
    pub fn new(offers: impl IntoIterator<Item = BurstOffer>) -> Bursts {
        let mut offers: Vec<BurstOffer> = offers.into_iter().collect();
        offers.sort_by_key(|offer| offer.offered_ms);
        let place = offers
            .iter()
            .enumerate()
            .map(|(place, offer)| (offer.key.clone(), place))
            .collect();
        Bursts { offers, place }
    }

    /// The job's path in the newest build, 0 when it did not run there.
    pub fn path(&self, key: &str) -> f64 {
        self.place
            .get(key)
            .map_or(0.0, |&place| self.offers[place].path)
    }

    /// Whether the newest build offered, in the same burst as the job `key` (and before it
    /// ended: a job offered after it may have waited for it), a job with a path longer by a
    /// second or more that has not `arrived` in this build yet: then the job waits for it, so
    /// that the queue's order and not the race to connect decides which starts first.
    pub fn longer_one_coming(&self, key: &str, arrived: &HashSet<String>) -> bool {
        self.place.get(key).is_some_and(|&place| {
            let offer = &self.offers[place];
            let from = offer.offered_ms.saturating_sub(BURST_MS);
            let to = (offer.offered_ms + BURST_MS).min(offer.end_ms.saturating_sub(1));
            self.longer_one_offered(from, to, offer.path, arrived)
        })
    }

    /// Whether the newest build offered, in a burst right after the job `key` ended, a job
    /// with a path longer than `than` by a second or more that has not `arrived` yet: the
    /// jobs that waited on it, which the build system is about to offer.
    pub fn longer_one_follows(&self, key: &str, than: f64, arrived: &HashSet<String>) -> bool {
        self.place.get(key).is_some_and(|&place| {
            let end_ms = self.offers[place].end_ms;
            self.longer_one_offered(end_ms, end_ms + BURST_MS, than, arrived)
        })
    }

    /// Whether a job offered from `from_ms` to `to_ms` has a path longer than `than` by
    /// [`WORTH_WAITING_SECONDS`] and has not `arrived`.
    fn longer_one_offered(
        &self,
        from_ms: u64,
        to_ms: u64,
        than: f64,
        arrived: &HashSet<String>,
    ) -> bool {
        let first = self
            .offers
            .partition_point(|offer| offer.offered_ms < from_ms);
        self.offers[first..]
            .iter()
            .take_while(|offer| offer.offered_ms <= to_ms)
            .any(|offer| offer.path > than + WORTH_WAITING_SECONDS && !arrived.contains(&offer.key))
    }
}
