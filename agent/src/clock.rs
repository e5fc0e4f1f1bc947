//! Wall-clock times as seconds since the Unix epoch, the form torch's error files,
//! the file timer's requests and the Xid events carry.

use std::time::SystemTime;

/// `t` in seconds since the epoch (0 for a time before it).
pub fn epoch_secs(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Now, in seconds since the epoch.
pub fn now_secs() -> f64 {
    epoch_secs(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn seconds_since_the_epoch_and_none_before_it() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1500);
        assert_eq!(epoch_secs(t), 1.5);
        assert_eq!(
            epoch_secs(SystemTime::UNIX_EPOCH - Duration::from_secs(1)),
            0.0
        );
        assert!(now_secs() > 1.7e9);
    }
}
