/*
 * Kafka's own DelayedOperationPurgatory (kafka-server-common) on the workload of
 * `purgatory bench purgatory`: a port of Kafka's TestPurgatoryPerformance that reads the request
 * intervals and latencies the Python side generated (same seed, same numbers), so both purgatories
 * run the identical workload. Prints one JSON line with the same figures as the Python sides.
 *
 *   java -cp <libs>/*:<classes> PurgatoryHarness perf <workload file> <timeout ms>
 *   java -cp <libs>/*:<classes> PurgatoryHarness memory <pending> <key>...
 *
 * Workload file: first line the keys (space separated), then one "<interval ms> <latency ms>" per
 * request. Compiled by tools/bench/core/jvm.py into a cache directory, never into the repository.
 */

import java.io.BufferedReader;
import java.io.IOException;
import java.lang.management.GarbageCollectorMXBean;
import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.DelayQueue;
import java.util.concurrent.Delayed;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.apache.kafka.server.purgatory.DelayedOperation;
import org.apache.kafka.server.purgatory.DelayedOperationKey;
import org.apache.kafka.server.purgatory.DelayedOperationPurgatory;

public final class PurgatoryHarness {

    static final long FINISH_TIMEOUT_S = 300;

    record Key(String label) implements DelayedOperationKey {
        @Override
        public String keyLabel() {
            return label;
        }
    }

    /** Counts finishes, repeats and expiries from any thread. */
    static final class Sink {
        final CountDownLatch latch;
        final AtomicInteger finishes = new AtomicInteger();
        final AtomicInteger repeats = new AtomicInteger();
        final List<Double> lateness = new ArrayList<>();

        Sink(int total) {
            latch = new CountDownLatch(total);
        }
    }

    /** Kafka's FakeOperation: completes once its latency has passed. */
    static final class FakeOperation extends DelayedOperation {
        final long completesAt;
        final double createdAt;
        final long delay;
        final Sink sink;
        int finished;

        FakeOperation(long delayMs, long latencyMs, Sink sink) {
            super(delayMs);
            this.delay = delayMs;
            this.createdAt = System.nanoTime() / 1e6;
            this.completesAt = System.currentTimeMillis() + latencyMs;
            this.sink = sink;
        }

        @Override
        public boolean tryComplete() {
            return System.currentTimeMillis() >= completesAt && forceComplete();
        }

        @Override
        public void onComplete() {
            if (++finished != 1) sink.repeats.incrementAndGet();
            sink.finishes.incrementAndGet();
            sink.latch.countDown();
        }

        @Override
        public void onExpiration() {
            double late = System.nanoTime() / 1e6 - (createdAt + delay);
            synchronized (sink.lateness) {
                sink.lateness.add(late);
            }
        }
    }

    /** Payload-free: what the purgatory itself costs per operation. */
    static final class IdleOperation extends DelayedOperation {
        IdleOperation(long delayMs) {
            super(delayMs);
        }

        @Override
        public boolean tryComplete() {
            return false;
        }

        @Override
        public void onComplete() {
        }

        @Override
        public void onExpiration() {
        }
    }

    /** Kafka's CompletionQueue: a DelayQueue polled by one thread that force-completes. */
    static final class CompletionQueue {
        record Scheduled(FakeOperation op) implements Delayed {
            @Override
            public long getDelay(TimeUnit unit) {
                return unit.convert(op.completesAt - System.currentTimeMillis(), TimeUnit.MILLISECONDS);
            }

            @Override
            public int compareTo(Delayed other) {
                return Long.compare(op.completesAt, ((Scheduled) other).op.completesAt);
            }
        }

        final DelayQueue<Scheduled> queue = new DelayQueue<>();
        volatile boolean running = true;
        final Thread thread = new Thread(() -> {
            while (running) {
                try {
                    Scheduled s = queue.poll(100, TimeUnit.MILLISECONDS);
                    if (s != null) s.op.forceComplete();
                } catch (InterruptedException e) {
                    return;
                }
            }
        }, "completion thread");

        CompletionQueue() {
            thread.setDaemon(true);
            thread.start();
        }

        void add(FakeOperation op) {
            queue.add(new Scheduled(op));
        }

        void shutdown() throws InterruptedException {
            running = false;
            thread.join();
        }
    }

    static long cpuNanos() {
        return ((com.sun.management.OperatingSystemMXBean) ManagementFactory.getOperatingSystemMXBean())
            .getProcessCpuTime();
    }

    static long[] gc() {
        long young = 0, old = 0, ms = 0;
        for (GarbageCollectorMXBean bean : ManagementFactory.getGarbageCollectorMXBeans()) {
            String name = bean.getName().toLowerCase();
            if (name.contains("young") || name.contains("scavenge") || name.contains("copy") || name.contains("parnew")) {
                young += bean.getCollectionCount();
            } else if (!name.contains("concurrent")) {  // G1's concurrent cycles pause nothing by themselves
                old += bean.getCollectionCount();
            }
            ms += bean.getCollectionTime();
        }
        return new long[] {young, old, ms};
    }

    // As tools/bench/measure.py's percentile (Python's statistics.quantiles, "inclusive"): the
    // value at position q * (n - 1), interpolated between the two ranks around it.
    static double percentile(List<Double> sorted, double q) {
        if (sorted.isEmpty()) return Double.NaN;
        double position = Math.min(1.0, Math.max(0.0, q)) * (sorted.size() - 1);
        int below = (int) Math.floor(position);
        int above = Math.min(sorted.size() - 1, below + 1);
        return sorted.get(below) + (sorted.get(above) - sorted.get(below)) * (position - below);
    }

    static String num(double v) {
        return Double.isNaN(v) || Double.isInfinite(v) ? "NaN" : Double.toString(v);
    }

    static void perf(Path workload, long timeout) throws Exception {
        List<String> keyNames;
        long[] intervals;
        long[] latencies;
        try (BufferedReader in = Files.newBufferedReader(workload)) {
            keyNames = Arrays.asList(in.readLine().trim().split(" "));
            List<long[]> rows = new ArrayList<>();
            for (String line = in.readLine(); line != null; line = in.readLine()) {
                String[] parts = line.trim().split(" ");
                rows.add(new long[] {Long.parseLong(parts[0]), Long.parseLong(parts[1])});
            }
            intervals = new long[rows.size()];
            latencies = new long[rows.size()];
            for (int i = 0; i < rows.size(); i++) {
                intervals[i] = rows.get(i)[0];
                latencies[i] = rows.get(i)[1];
            }
        }
        int n = intervals.length;
        List<Key> keys = new ArrayList<>();
        for (String k : keyNames) keys.add(new Key(k));
        Sink sink = new Sink(n);
        CompletionQueue queue = new CompletionQueue();
        DelayedOperationPurgatory<FakeOperation> purgatory = new DelayedOperationPurgatory<>("fake purgatory", 0);

        System.gc();
        long[] gc0 = gc();
        long cpu0 = cpuNanos();
        double start = System.nanoTime() / 1e6;
        double[] arrivalEnd = new double[2];
        Throwable[] failure = new Throwable[1];
        Thread generator = new Thread(() -> {
            try {
                double arrival = start;
                for (int i = 0; i < n; i++) {
                    arrival += intervals[i];
                    double now = System.nanoTime() / 1e6;
                    if (arrival > now) Thread.sleep((long) (arrival - now));
                    FakeOperation op = new FakeOperation(timeout, latencies[i], sink);
                    if (latencies[i] < timeout) queue.add(op);
                    purgatory.tryCompleteElseWatch(op, keys);
                }
                arrivalEnd[0] = arrival;
                arrivalEnd[1] = System.nanoTime() / 1e6;
            } catch (Throwable t) {
                failure[0] = t;
                while (sink.latch.getCount() > 0) sink.latch.countDown();
            }
        }, "generator");
        generator.start();
        generator.join();
        boolean finished = sink.latch.await(FINISH_TIMEOUT_S, TimeUnit.SECONDS);
        double done = System.nanoTime() / 1e6;
        long cpu = cpuNanos() - cpu0;
        long[] gc1 = gc();
        queue.shutdown();
        purgatory.shutdown();
        if (failure[0] != null) throw new AssertionError("the generator failed", failure[0]);
        if (!finished) throw new AssertionError("requests unfinished after " + FINISH_TIMEOUT_S + " s");
        int finishes = sink.finishes.get();
        if (sink.repeats.get() != 0 || finishes != n) {
            throw new AssertionError(n + " requests, " + finishes + " finishes, " + sink.repeats.get()
                + " repeats: not every request finished exactly once");
        }
        double end = arrivalEnd[1];
        double actualRate = n * 1000.0 / Math.max(end - start, 1e-9);
        double targetRate = arrivalEnd[0] > start ? n * 1000.0 / (arrivalEnd[0] - start) : Double.NaN;
        List<Double> lateness = new ArrayList<>(sink.lateness);
        lateness.sort(null);
        double cpuMs = cpu / 1e6;
        System.out.println("{\"finished_exactly_once\": " + finishes
            + ", \"req_per_s\": " + num(actualRate)
            + ", \"elapsed_ms\": " + num(done - start)
            + ", \"target_rate\": " + num(targetRate)
            + ", \"actual_rate\": " + num(actualRate)
            + ", \"us_per_enqueue\": " + num(1e6 / actualRate)
            + ", \"cpu_ms\": " + num(cpuMs)
            + ", \"cpu_us_per_request\": " + num(cpuMs * 1000.0 / n)
            + ", \"expired\": " + lateness.size()
            + ", \"expiry_lateness_p50_ms\": " + num(percentile(lateness, 0.5))
            + ", \"expiry_lateness_p99_ms\": " + num(percentile(lateness, 0.99))
            + ", \"variant\": \"JVM " + System.getProperty("java.version") + ", kafka-server-common\""
            + ", \"gc_counts\": [" + (gc1[0] - gc0[0]) + ", " + (gc1[1] - gc0[1]) + ", 0]"
            + ", \"gc_ms\": " + (gc1[2] - gc0[2]) + "}");
    }

    static long usedHeap() throws InterruptedException {
        Runtime rt = Runtime.getRuntime();
        long used = Long.MAX_VALUE;
        for (int i = 0; i < 5; i++) {  // until a full GC no longer frees anything
            System.gc();
            Thread.sleep(50);
            long now = rt.totalMemory() - rt.freeMemory();
            if (now >= used) return Math.min(now, used);
            used = now;
        }
        return used;
    }

    static void memory(int pending, List<String> keyNames) throws Exception {
        List<Key> keys = new ArrayList<>();
        for (String k : keyNames) keys.add(new Key(k));
        DelayedOperationPurgatory<IdleOperation> purgatory = new DelayedOperationPurgatory<>("memory purgatory", 0);
        long hour = 3_600_000L;
        for (int i = 0; i < 1000; i++) purgatory.tryCompleteElseWatch(new IdleOperation(hour), keys);  // warm-up
        IdleOperation[] ops = new IdleOperation[pending];
        long before = usedHeap();
        for (int i = 0; i < pending; i++) {
            ops[i] = new IdleOperation(hour);
            purgatory.tryCompleteElseWatch(ops[i], keys);
        }
        long after = usedHeap();
        int delayed = purgatory.numDelayed();
        purgatory.shutdown();
        if (delayed != pending + 1000) throw new AssertionError(delayed + " timed, expected " + (pending + 1000));
        System.out.println("{\"bytes_per_op\": " + num((after - before) / (double) pending)
            + ", \"op_object_bytes\": 0, \"pending\": " + pending
            + ", \"variant\": \"JVM " + System.getProperty("java.version") + ", kafka-server-common\"}");
    }

    public static void main(String[] args) throws Exception {
        switch (args[0]) {
            case "perf" -> perf(Path.of(args[1]), Long.parseLong(args[2]));
            case "memory" -> memory(Integer.parseInt(args[1]), Arrays.asList(args).subList(2, args.length));
            default -> throw new IllegalArgumentException("mode must be perf or memory, got " + args[0]);
        }
        System.exit(0);  // the purgatory's threads are not all daemons
    }
}
