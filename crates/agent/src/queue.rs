//! The export queue between the sampling side and the exporter: bounded,
//! and when it is full the oldest export is dropped (and counted), so a
//! backend that is down never holds up sampling nor grows the agent.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

pub struct Queue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    capacity: usize,
}

struct State<T> {
    items: VecDeque<T>,
    dropped: u64,
    closed: bool,
}

impl<T> Queue<T> {
    pub fn new(capacity: usize) -> Queue<T> {
        Queue {
            state: Mutex::new(State {
                items: VecDeque::new(),
                dropped: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            capacity: capacity.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic elsewhere while holding the lock leaves a usable queue.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds an item, dropping the oldest when full.
    pub fn push(&self, item: T) {
        let mut s = self.lock();
        while s.items.len() >= self.capacity {
            s.items.pop_front();
            s.dropped += 1;
        }
        s.items.push_back(item);
        drop(s);
        self.ready.notify_one();
    }

    /// The oldest item, waiting up to `timeout`; `None` on timeout, or when
    /// the queue is closed and empty.
    pub fn pop(&self, timeout: Duration) -> Option<T> {
        let s = self.lock();
        let (mut s, _) = self
            .ready
            .wait_timeout_while(s, timeout, |s| s.items.is_empty() && !s.closed)
            .unwrap_or_else(|e| e.into_inner());
        s.items.pop_front()
    }

    /// No more items will come: a waiting `pop` returns.
    pub fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Items dropped because the queue was full.
    pub fn dropped(&self) -> u64 {
        self.lock().dropped
    }

    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts_it() {
        let q = Queue::new(2);
        q.push(1);
        q.push(2);
        q.push(3);
        assert_eq!(q.dropped(), 1);
        assert_eq!(q.pop(Duration::ZERO), Some(2));
        assert_eq!(q.pop(Duration::ZERO), Some(3));
        assert_eq!(q.pop(Duration::from_millis(1)), None);
    }

    #[test]
    fn closing_wakes_a_waiting_consumer() {
        let q = std::sync::Arc::new(Queue::<u32>::new(1));
        let waiter = {
            let q = q.clone();
            std::thread::spawn(move || q.pop(Duration::from_secs(600)))
        };
        q.close();
        assert_eq!(waiter.join().unwrap(), None);
        assert!(q.is_closed());
    }
}
