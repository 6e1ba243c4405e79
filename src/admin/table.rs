//! Human output of the admin command: aligned text tables, UTC times, time arguments.

/// A text table whose columns are padded to their widest cell.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Spaces between two columns.
const COLUMN_GAP: usize = 2;

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        Table {
            headers: headers.iter().map(|h| format!("#{h}")).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (index, cell) in row.iter().enumerate().take(columns) {
                widths[index] = widths[index].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        for line in std::iter::once(&self.headers).chain(&self.rows) {
            let mut text = String::new();
            for (index, cell) in line.iter().enumerate().take(columns) {
                if index + 1 == columns {
                    text.push_str(cell);
                } else {
                    let pad = widths[index] - cell.chars().count() + COLUMN_GAP;
                    text.push_str(cell);
                    text.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `YYYY-MM-DD HH:MM:SS.mmm` in UTC; "-" for 0 or negative (no time).
pub fn format_time_ms(ms: i64) -> String {
    if ms <= 0 {
        return "-".to_string();
    }
    let seconds = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{millis:03}",
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A time argument: milliseconds since the epoch, `now`, or `now-<N><s|m|h|d>`.
pub fn parse_time_ms(text: &str, now_ms: i64) -> Result<i64, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Ok(ms);
    }
    if text == "now" {
        return Ok(now_ms);
    }
    let bad = || {
        format!("bad time {text:?}: want milliseconds since the epoch, `now`, or `now-10m` (s, m, h, d)")
    };
    let ago = text.strip_prefix("now-").ok_or_else(bad)?;
    let (number, unit) = ago.split_at(ago.len().saturating_sub(1));
    let count: i64 = number.parse().map_err(|_| bad())?;
    let unit_ms = match unit {
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(bad()),
    };
    Ok(now_ms - count.saturating_mul(unit_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_columns() {
        let mut table = Table::new(&["Topic", "QID"]);
        table.row(vec!["LongTopicName".into(), "0".into()]);
        table.row(vec!["T".into(), "12".into()]);
        assert_eq!(
            table.render(),
            "#Topic         #QID\nLongTopicName  0\nT              12\n"
        );
    }

    #[test]
    fn times() {
        assert_eq!(format_time_ms(0), "-");
        assert_eq!(format_time_ms(1_700_000_000_123), "2023-11-14 22:13:20.123");
        assert_eq!(format_time_ms(951_782_400_000), "2000-02-29 00:00:00.000");
        assert_eq!(parse_time_ms("123", 0), Ok(123));
        assert_eq!(parse_time_ms("now", 5_000), Ok(5_000));
        assert_eq!(parse_time_ms("now-2m", 500_000), Ok(380_000));
        assert!(parse_time_ms("yesterday", 0).is_err());
        assert!(parse_time_ms("now-5x", 0).is_err());
    }
}
