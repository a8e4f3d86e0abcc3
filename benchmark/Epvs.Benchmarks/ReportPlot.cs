using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;
using ScottPlot;
using SkiaSharp;

namespace Epvs.Benchmarks;

/// <summary>
/// Turns the joined GitHub-Markdown report of a suite run into a horizontal bar chart (ScottPlot) of the median
/// per-operation time (the statistic RESULTS.md quotes), one group per category, so the Epvs/FASTER.core ratios can be
/// seen at a glance. The time axis is logarithmic: the suite spans 1 ns to 500 ns, and a ratio is the same length
/// wherever it falls. Whiskers show the spread: min to max where the report has those columns (runs from this
/// program add them), else one standard deviation either side.
/// </summary>
public static class ReportPlot
{
    /// <summary>One bar: a benchmark method in a group, its median and the ends of its whisker (ns).</summary>
    public sealed record Row(string Group, string Method, double MedianNs, double LowNs, double HighNs);

    /// <summary>Reads the rows of a joined report; rows whose median does not parse are left out.</summary>
    public static (IReadOnlyList<Row> Rows, bool MinMax) Read(string reportPath)
    {
        var rows = new List<Row>();
        string[]? header = null;
        bool minMax = false;
        foreach (string raw in File.ReadLines(reportPath))
        {
            if (!raw.StartsWith('|'))
                continue;
            string[] cells = raw.Replace("**", "").Trim('|').Split('|').Select(c => c.Trim()).ToArray();
            if (header is null)
            {
                header = cells;
                minMax = header.Contains("Min") && header.Contains("Max");
                continue;
            }
            if (cells.All(c => c.Length == 0 || c.All(ch => ch == '-' || ch == ':')))
                continue;
            string Cell(string name) => Array.IndexOf(header, name) is int i && i >= 0 && i < cells.Length ? cells[i] : "";
            string method = Cell("Method");
            double median = ParseNs(Cell("Median"));
            if (method.Length == 0 || double.IsNaN(median))
                continue;
            string category = Cell("Categories");
            string group = category.Length == 0 ? "Reader side, uncontended (" + Cell("Type") + ")" : category;
            string refreshers = Cell("Refreshers");
            if (refreshers.Length > 0 && refreshers != "?")
                group += $", {refreshers} other thread(s) refreshing";
            double low, high;
            if (minMax)
            {
                low = ParseNs(Cell("Min"));
                high = ParseNs(Cell("Max"));
            }
            else
            {
                double sd = ParseNs(Cell("StdDev"));
                sd = double.IsNaN(sd) ? 0 : sd;
                low = Math.Max(0, median - sd);
                high = median + sd;
            }
            rows.Add(new Row(group, method, median, double.IsNaN(low) ? median : low, double.IsNaN(high) ? median : high));
        }
        return (rows, minMax);
    }

    /// <summary>Reads <paramref name="reportPath"/> and writes the chart to <paramref name="imagePath"/> (.svg or .png).</summary>
    /// <returns>The number of bars drawn.</returns>
    public static int Write(string reportPath, string imagePath)
    {
        (IReadOnlyList<Row> rows, bool minMax) = Read(reportPath);
        var plot = new Plot();
        // ScottPlot's own choice falls back to a serif font on a Linux box with only the DejaVu fonts.
        string[] families = SKFontManager.Default.GetFontFamilies();
        if (((string[])["DejaVu Sans", "Liberation Sans", "Arial", "Helvetica"]).FirstOrDefault(families.Contains) is string sans)
            plot.Font.Set(sans);

        // Top to bottom: a header line per group, then its bars. Positions count down so the first group is on top.
        var tickPositions = new List<double>();
        var tickLabels = new List<string>();
        var bars = new Dictionary<string, List<Bar>>();
        var whiskerPos = new List<double>();
        var whiskerMedian = new List<double>();
        var whiskerLow = new List<double>();
        var whiskerHigh = new List<double>();
        // Log scale: ScottPlot draws a linear axis, so the bars hold log10(ns) and the ticks are labelled in ns.
        double floorNs = Math.Pow(10, Math.Floor(Math.Log10(Math.Max(rows.Select(r => r.LowNs).Where(v => v > 0).DefaultIfEmpty(1).Min(), 1e-3))));
        double ceilNs = Math.Pow(10, Math.Ceiling(Math.Log10(Math.Max(rows.Select(r => r.HighNs).DefaultIfEmpty(10).Max(), floorNs * 10))));
        double Log(double ns) => Math.Log10(Math.Max(ns, floorNs));
        double y = 0;
        foreach (var group in rows.GroupBy(r => r.Group))
        {
            tickPositions.Add(y);
            tickLabels.Add("[" + group.Key + "]");
            y -= 1;
            foreach (Row r in group)
            {
                string family = Family(r.Method);
                if (!bars.TryGetValue(family, out List<Bar>? list))
                    bars[family] = list = new List<Bar>();
                list.Add(new Bar
                {
                    Position = y,
                    Value = Log(r.MedianNs),
                    ValueBase = Log(floorNs),
                    Size = 0.7,
                    FillColor = FamilyColor(family),
                    LineWidth = 0,
                    Label = r.MedianNs.ToString("0.##", CultureInfo.InvariantCulture) + " ns",
                });
                tickPositions.Add(y);
                tickLabels.Add(r.Method);
                whiskerPos.Add(y);
                whiskerMedian.Add(Log(r.MedianNs));
                whiskerLow.Add(Log(r.MedianNs) - Log(r.LowNs));
                whiskerHigh.Add(Log(r.HighNs) - Log(r.MedianNs));
                y -= 1;
            }
            y -= 0.5;
        }
        foreach ((string family, List<Bar> list) in bars.OrderBy(b => FamilyOrder(b.Key)))
        {
            var barPlot = plot.Add.Bars(list);
            barPlot.Horizontal = true;
            barPlot.LegendText = family;
            barPlot.Color = FamilyColor(family);
        }
        if (whiskerPos.Count > 0)
        {
            var whiskers = plot.Add.ErrorBar(whiskerMedian, whiskerPos, new double[whiskerPos.Count]);
            whiskers.XErrorNegative = whiskerLow;
            whiskers.XErrorPositive = whiskerHigh;
            whiskers.Color = Colors.Black;
            whiskers.LineWidth = 1;
            whiskers.CapSize = 3;
        }

        plot.Title("Per-operation cost (median ns per operation; shorter is better)", 16);
        plot.XLabel(minMax ? "ns per operation (log scale): median; whiskers min to max" : "ns per operation (log scale): median; whiskers ±1 standard deviation");
        var xTicks = new List<double>();
        var xLabels = new List<string>();
        for (double decade = floorNs; decade < ceilNs * 1.01; decade *= 10)
        {
            foreach (double m in (double[])[1, 2, 5])
            {
                if (decade * m <= ceilNs * 1.01)
                {
                    xTicks.Add(Log(decade * m));
                    xLabels.Add((decade * m).ToString("0.###", CultureInfo.InvariantCulture));
                }
            }
        }
        plot.Axes.Bottom.SetTicks(xTicks.ToArray(), xLabels.ToArray());
        plot.Axes.Left.SetTicks(tickPositions.ToArray(), tickLabels.ToArray());
        plot.Axes.Left.MajorTickStyle.Length = 0;
        plot.Grid.YAxisStyle.MajorLineStyle.Width = 0;
        plot.Axes.SetLimitsX(Log(floorNs), Log(ceilNs) + 0.3); // room for the last value label
        plot.Axes.SetLimitsY(y - 0.5, 0.8);
        plot.ShowLegend(Edge.Right);

        int height = Math.Max(400, 120 + (int)(-y * 20));
        const int width = 1100;
        switch (Path.GetExtension(imagePath).ToLowerInvariant())
        {
            case ".svg":
                plot.SaveSvg(imagePath, width, height);
                break;
            case ".png":
                plot.SavePng(imagePath, width, height);
                break;
            default:
                throw new ArgumentException($"cannot write a plot as '{Path.GetExtension(imagePath)}' (use .svg or .png)", nameof(imagePath));
        }
        return rows.Count;
    }

    private static string Family(string method) =>
        method.StartsWith("Epvs", StringComparison.Ordinal) ? "Epvs"
        : method.StartsWith("Faster", StringComparison.Ordinal) ? "FASTER.core 2.6.5"
        : "other baselines";

    private static int FamilyOrder(string family) => family switch { "Epvs" => 0, "FASTER.core 2.6.5" => 1, _ => 2 };

    private static Color FamilyColor(string family) => family switch
    {
        "Epvs" => Color.FromHex("#1f77b4"),
        "FASTER.core 2.6.5" => Color.FromHex("#ff7f0e"),
        _ => Color.FromHex("#8c8c8c"),
    };

    private static double ParseNs(string cell)
    {
        string[] parts = cell.Replace(",", "").Split(' ', StringSplitOptions.RemoveEmptyEntries);
        if (parts.Length == 0 || !double.TryParse(parts[0], NumberStyles.Float, CultureInfo.InvariantCulture, out double v))
            return double.NaN;
        return parts.Length > 1 ? parts[1] switch { "us" or "μs" => v * 1e3, "ms" => v * 1e6, "s" => v * 1e9, _ => v } : v;
    }
}
