using System;
using System.Collections.Generic;
using System.Diagnostics.CodeAnalysis;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Text;

namespace Epvs.Scaling.Harness;

/// <summary>
/// One figure's measurements: a value per (series, x) point, rendered as a Markdown table, a CSV file (every repetition)
/// and a PNG line plot (<see cref="FigurePlot"/>). X values are categories (thread counts, probabilities, table sizes)
/// plotted at equal spacing.
/// </summary>
public sealed class FigureResult
{
    private readonly Dictionary<(string Series, string X), Measurement> points = new();
    private readonly List<string> series = new();
    private readonly List<string> notes = new();
    private readonly List<string> checks = new();

    // Set when the figure was read back from a CSV file: the x values that were oversubscribed on the machine that
    // measured them, which need not be this one.
    private HashSet<string>? recordedOversubscribed;

    /// <summary>Creates an empty figure.</summary>
    public FigureResult(string id, string title, string xLabel, IEnumerable<string> xValues, bool xIsThreads)
    {
        Id = id;
        Title = title;
        XLabel = xLabel;
        XValues = xValues.ToList();
        XIsThreads = xIsThreads;
    }

    /// <summary>File stem, such as "fig11".</summary>
    public string Id { get; }

    /// <summary>Title for the plot and the section.</summary>
    public string Title { get; }

    /// <summary>The x axis label.</summary>
    public string XLabel { get; }

    /// <summary>The x categories, in order.</summary>
    public IReadOnlyList<string> XValues { get; }

    /// <summary>Whether x values are thread counts (oversubscribed ones are starred and shaded).</summary>
    public bool XIsThreads { get; }

    /// <summary>The series names, in the order first added.</summary>
    public IReadOnlyList<string> Series => series;

    private readonly List<(string Series, string X, int Threads, Func<RunContext> Setup)> scheduled = new();

    /// <summary>Schedules a point for <see cref="RunScheduled"/>.</summary>
    public void Schedule(string seriesName, string x, int threads, Func<RunContext> setup)
    {
        if (!series.Contains(seriesName))
            series.Add(seriesName);
        scheduled.Add((seriesName, x, threads, setup));
    }

    /// <summary>
    /// Measures every scheduled point, interleaved: one warm-up run per point, then repetition r of every point before
    /// repetition r + 1 of any, so a burst of load from other processes on this shared machine hits all series of
    /// the figure rather than one. Records the medians.
    /// </summary>
    public void RunScheduled(RunSettings settings)
    {
        if (settings.Warmup > TimeSpan.Zero)
        {
            Console.WriteLine($"  {Id}: warming up {scheduled.Count} points (~{(scheduled.Count * settings.Warmup).TotalSeconds:0} s)");
            foreach (var p in scheduled)
                ThroughputRunner.RunOnce(p.Threads, settings.Warmup, p.Setup);
        }
        var samples = scheduled.Select(_ => new List<double>()).ToList();
        for (int r = 0; r < settings.Repetitions; r++)
        {
            // A repetition of a whole figure runs for seconds; say where we are.
            Console.WriteLine($"  {Id}: repetition {r + 1}/{settings.Repetitions} of {scheduled.Count} points (~{(scheduled.Count * settings.Duration).TotalSeconds:0} s)");
            for (int i = 0; i < scheduled.Count; i++)
                samples[i].Add(ThroughputRunner.RunOnce(scheduled[i].Threads, settings.Duration, scheduled[i].Setup));
        }
        for (int i = 0; i < scheduled.Count; i++)
        {
            double[] sorted = samples[i].OrderBy(v => v).ToArray();
            var m = new Measurement(sorted[sorted.Length / 2], samples[i].ToArray());
            (string s, string x, int threads, _) = scheduled[i];
            points[(s, x)] = m;
            Console.WriteLine($"  {Id} {s,-48} threads={RunSettings.ThreadLabel(threads),-3} x={x,-7} {Format(m.Median),8} Mops/s");
        }
        scheduled.Clear();
    }

    /// <summary>Records a point.</summary>
    public void Add(string seriesName, string x, Measurement m)
    {
        if (!series.Contains(seriesName))
            series.Add(seriesName);
        points[(seriesName, x)] = m;
    }

    /// <summary>The measurement at a point, if there is one.</summary>
    public bool TryGetMeasurement(string seriesName, string x, [NotNullWhen(true)] out Measurement? measurement) =>
        points.TryGetValue((seriesName, x), out measurement);

    /// <summary>The median at a point, or NaN if not measured.</summary>
    public double Get(string seriesName, string x) => points.TryGetValue((seriesName, x), out Measurement? m) ? m.Median : double.NaN;

    /// <summary>Adds a sentence printed under the table.</summary>
    public void Note(string text) => notes.Add(text);

    /// <summary>Adds a computed ratio (a target check) printed under the table.</summary>
    public void Check(string text) => checks.Add(text);

    /// <summary>The computed checks (printed to the console as well).</summary>
    public IReadOnlyList<string> Checks => checks;

    /// <summary>Whether <paramref name="x"/> is a thread count above the cores of the machine that measured it.</summary>
    public bool IsOversubscribed(string x) =>
        recordedOversubscribed is not null ? recordedOversubscribed.Contains(x) :
        XIsThreads && int.TryParse(x, NumberStyles.Integer, CultureInfo.InvariantCulture, out int t) && t > RunSettings.Cores;

    private string XHeader(string x) => IsOversubscribed(x) ? x + "*" : x;

    /// <summary>The Markdown section: table (x down, series across; Mops/s medians), notes and checks.</summary>
    public string ToMarkdown(string command, string machine, RunSettings settings)
    {
        var sb = new StringBuilder();
        sb.AppendLine($"### {Id}: {Title}");
        sb.AppendLine();
        sb.AppendLine($"- Command: `{command}`");
        sb.AppendLine($"- Machine: {machine}");
        sb.AppendLine($"- Settings: median of {settings.Repetitions} run(s) of {settings.Duration.TotalMilliseconds:0} ms" +
                      (settings.Warmup > TimeSpan.Zero ? $" after a {settings.Warmup.TotalMilliseconds:0} ms warm-up" : "") +
                      ", interleaved (repetition r of every series runs before repetition r+1 of any)" +
                      "; throughput in million operations per second (Mops/s), all threads together.");
        sb.AppendLine();
        sb.AppendLine($"![{Id}](results/{Id}.png)");
        sb.AppendLine();
        sb.Append("| ").Append(XLabel).Append(" |");
        foreach (string s in series)
            sb.Append(' ').Append(s.Replace("|", "\\|")).Append(" |");
        sb.AppendLine();
        sb.Append("|---|");
        foreach (string _ in series)
            sb.Append("---:|");
        sb.AppendLine();
        foreach (string x in XValues)
        {
            sb.Append("| ").Append(XHeader(x)).Append(" |");
            foreach (string s in series)
            {
                double v = Get(s, x);
                sb.Append(' ').Append(double.IsNaN(v) ? "—" : Format(v)).Append(" |");
            }
            sb.AppendLine();
        }
        sb.AppendLine();
        if (XIsThreads && XValues.Any(IsOversubscribed))
            sb.AppendLine($"\\* oversubscribed: more threads than the machine's {RunSettings.Cores} cores.");
        foreach (string n in notes)
            sb.AppendLine($"- {n}");
        foreach (string c in checks)
            sb.AppendLine($"- **{c}**");
        sb.AppendLine();
        return sb.ToString();
    }

    /// <summary>Writes <c>{Id}.csv</c> (every sample) and the plot <c>{Id}.png</c> into <paramref name="directory"/>.</summary>
    public void Write(string directory)
    {
        Directory.CreateDirectory(directory);
        var csv = new StringBuilder("series,x,oversubscribed,median_mops,samples_mops\n");
        foreach (string s in series)
        {
            foreach (string x in XValues)
            {
                if (!points.TryGetValue((s, x), out Measurement? m))
                    continue;
                csv.Append('"').Append(s.Replace("\"", "\"\"")).Append("\",").Append(x).Append(',')
                   .Append(IsOversubscribed(x) ? "yes" : "no").Append(',').Append(Format(m.Median)).Append(',')
                   .AppendLine(string.Join(' ', m.Samples.Select(Format)));
            }
        }
        File.WriteAllText(Path.Combine(directory, Id + ".csv"), csv.ToString());

        FigurePlot.Save(this, Path.Combine(directory, Id + ".png"));
    }

    /// <summary>
    /// Reads a figure back from the CSV file <see cref="Write"/> made (header
    /// <c>series,x,oversubscribed,median_mops,samples_mops</c>), for drawing it again without measuring.
    /// </summary>
    /// <exception cref="FormatException">The file is not such a CSV file; the message names the line.</exception>
    public static FigureResult ReadCsv(string csvPath, string title, string xLabel)
    {
        string[] lines = File.ReadAllLines(csvPath);
        const string header = "series,x,oversubscribed,median_mops,samples_mops";
        if (lines.Length == 0 || lines[0].Trim() != header)
            throw new FormatException($"{csvPath}: the first line is not '{header}'");
        var rows = new List<(string Series, string X, bool Over, Measurement M)>();
        for (int i = 1; i < lines.Length; i++)
        {
            if (lines[i].Length == 0)
                continue;
            List<string> cells = SplitCsvLine(lines[i]);
            if (cells.Count != 5)
                throw new FormatException($"{csvPath}:{i + 1}: expected 5 fields, found {cells.Count}");
            double median = ParseNumber(cells[3], csvPath, i);
            double[] samples = cells[4].Split(' ', StringSplitOptions.RemoveEmptyEntries).Select(v => ParseNumber(v, csvPath, i)).ToArray();
            rows.Add((cells[0], cells[1], cells[2] == "yes", new Measurement(median, samples)));
        }
        var fig = new FigureResult(Path.GetFileNameWithoutExtension(csvPath), title, xLabel, rows.Select(r => r.X).Distinct(), xLabel == "threads")
        {
            recordedOversubscribed = rows.Where(r => r.Over).Select(r => r.X).ToHashSet(),
        };
        foreach (var r in rows)
            fig.Add(r.Series, r.X, r.M);
        return fig;
    }

    private static double ParseNumber(string text, string path, int line) =>
        double.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out double v)
            ? v
            : throw new FormatException($"{path}:{line + 1}: '{text}' is not a number");

    // The writer quotes only the series name (doubling any quote in it); the other fields never hold a comma.
    private static List<string> SplitCsvLine(string line)
    {
        var cells = new List<string>();
        var cell = new StringBuilder();
        bool quoted = false;
        for (int i = 0; i < line.Length; i++)
        {
            char c = line[i];
            if (quoted)
            {
                if (c == '"' && i + 1 < line.Length && line[i + 1] == '"')
                {
                    cell.Append('"');
                    i++;
                }
                else if (c == '"')
                    quoted = false;
                else
                    cell.Append(c);
            }
            else if (c == '"')
                quoted = true;
            else if (c == ',')
            {
                cells.Add(cell.ToString());
                cell.Clear();
            }
            else
                cell.Append(c);
        }
        cells.Add(cell.ToString());
        return cells;
    }

    /// <summary>Formats a throughput with three significant digits.</summary>
    public static string Format(double v) =>
        v >= 100 ? v.ToString("0", CultureInfo.InvariantCulture)
        : v >= 10 ? v.ToString("0.0", CultureInfo.InvariantCulture)
        : v >= 1 ? v.ToString("0.00", CultureInfo.InvariantCulture)
        : v.ToString("0.000", CultureInfo.InvariantCulture);
}
