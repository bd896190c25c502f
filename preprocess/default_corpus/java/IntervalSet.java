import java.util.ArrayList;
import java.util.List;

/** A set of closed integer intervals kept sorted and merged. */
public final class IntervalSet {
    private final List<int[]> intervals = new ArrayList<>();

    public void add(int lo, int hi) {
        if (lo > hi) {
            throw new IllegalArgumentException("lo > hi: " + lo + " > " + hi);
        }
        List<int[]> merged = new ArrayList<>();
        int i = 0;
        while (i < intervals.size() && intervals.get(i)[1] < lo - 1) {
            merged.add(intervals.get(i++));
        }
        while (i < intervals.size() && intervals.get(i)[0] <= hi + 1) {
            lo = Math.min(lo, intervals.get(i)[0]);
            hi = Math.max(hi, intervals.get(i)[1]);
            i++;
        }
        merged.add(new int[] {lo, hi});
        while (i < intervals.size()) {
            merged.add(intervals.get(i++));
        }
        intervals.clear();
        intervals.addAll(merged);
    }

    public boolean contains(int x) {
        int left = 0, right = intervals.size() - 1;
        while (left <= right) {
            int mid = (left + right) >>> 1;
            int[] iv = intervals.get(mid);
            if (x < iv[0]) right = mid - 1;
            else if (x > iv[1]) left = mid + 1;
            else return true;
        }
        return false;
    }

    public int size() {
        return intervals.size();
    }
}
