using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using ScottPlot;
using SkiaSharp;

namespace Epvs.Scaling.Harness;

/// <summary>
/// Draws a <see cref="FigureResult"/> with ScottPlot: the median of each point (the statistic the tables report) joined
/// by a line, whiskers from the smallest to the largest repetition, categorical x values at equal spacing, and the
/// oversubscribed thread counts shaded. The legend sits outside the data area, to the right.
/// </summary>
public static class FigurePlot
{
    /// <summary>Pixel size of every figure; the legend panel takes its width from the right of it.</summary>
    public const int Width = 1100, Height = 560;

    // "Mechanism, variant" series share the mechanism's colour and differ by line pattern; every series also has its
    // own marker shape, so no two series look alike even where colours repeat (more than 10 mechanisms) or print grey.
    private static readonly LinePattern[] Patterns = [LinePattern.Solid, LinePattern.Dashed, LinePattern.Dotted, LinePattern.DenselyDashed];

    private static readonly MarkerShape[] Markers =
    [
        MarkerShape.FilledCircle, MarkerShape.FilledSquare, MarkerShape.FilledTriangleUp, MarkerShape.FilledDiamond,
        MarkerShape.OpenCircle, MarkerShape.OpenSquare, MarkerShape.OpenTriangleUp, MarkerShape.OpenDiamond,
        MarkerShape.FilledTriangleDown, MarkerShape.OpenTriangleDown, MarkerShape.Eks, MarkerShape.Cross, MarkerShape.Asterisk,
        MarkerShape.OpenCircleWithDot,
    ];

    /// <summary>
    /// Writes the figure to <paramref name="path"/>: PNG for a <c>.png</c> name, SVG for <c>.svg</c>. The harness writes
    /// PNG: SkiaSharp's SVG backend does not support dash effects, so an SVG draws every line solid.
    /// </summary>
    public static void Save(FigureResult figure, string path)
    {
        string extension = Path.GetExtension(path).ToLowerInvariant();
        // SVG cannot show the dashes (and SkiaSharp prints a complaint per dashed line): draw them solid there.
        Plot plot = Build(figure, dashes: extension != ".svg");
        switch (extension)
        {
            case ".svg":
                plot.SaveSvg(path, Width, Height);
                break;
            case ".png":
                plot.SavePng(path, Width, Height);
                break;
            default:
                throw new ArgumentException($"cannot write a plot as '{extension}' (use .svg or .png)", nameof(path));
        }
    }

    /// <summary>Builds the plot; the series in it are the figure's series, in order.</summary>
    /// <param name="figure">The measurements.</param>
    /// <param name="dashes">Whether the variants of a mechanism differ by line pattern (else all lines are solid and
    /// only marker shapes tell them apart).</param>
    public static Plot Build(FigureResult figure, bool dashes = true)
    {
        var plot = new Plot();
        UseSansFont(plot);
        IReadOnlyList<string> xs = figure.XValues;
        int n = xs.Count;

        var mechanisms = new List<string>();
        var variants = new List<string>();
        foreach (string s in figure.Series)
        {
            (string mech, string variant) = Split(s);
            if (!mechanisms.Contains(mech))
                mechanisms.Add(mech);
            if (!variants.Contains(variant))
                variants.Add(variant);
        }
        IPalette palette = mechanisms.Count <= 10 ? new ScottPlot.Palettes.Category10() : new ScottPlot.Palettes.Category20();

        int firstOver = Enumerable.Range(0, n).FirstOrDefault(i => figure.IsOversubscribed(xs[i]), -1);
        if (firstOver >= 0)
        {
            var span = plot.Add.HorizontalSpan(firstOver - 0.5, n - 0.5, Colors.Red.WithAlpha(0.08));
            span.LineWidth = 0;
            span.LegendText = "oversubscribed (more threads than cores)";
        }

        // Whiskers of neighbouring series would sit on top of each other; spread the series a little around each x.
        int count = figure.Series.Count;
        double dodgeStep = count <= 1 ? 0 : Math.Min(0.05, 0.4 / (count - 1));
        double max = 0;
        int repetitions = 0;
        for (int k = 0; k < count; k++)
        {
            string name = figure.Series[k];
            (string mech, string variant) = Split(name);
            Color color = palette.GetColor(mechanisms.IndexOf(mech));
            double offset = (k - (count - 1) / 2.0) * dodgeStep;
            var px = new List<double>();
            var median = new List<double>();
            var below = new List<double>();
            var above = new List<double>();
            for (int i = 0; i < n; i++)
            {
                if (!figure.TryGetMeasurement(name, xs[i], out Measurement? m))
                    continue;
                px.Add(i + offset);
                median.Add(m.Median);
                double lo = m.Samples.Length > 0 ? m.Samples.Min() : m.Median;
                double hi = m.Samples.Length > 0 ? m.Samples.Max() : m.Median;
                below.Add(m.Median - lo);
                above.Add(hi - m.Median);
                max = Math.Max(max, Math.Max(hi, m.Median));
                repetitions = Math.Max(repetitions, m.Samples.Length);
            }
            if (px.Count == 0)
                continue;
            var line = plot.Add.Scatter(px.ToArray(), median.ToArray(), color);
            line.LegendText = name;
            line.LineWidth = 2;
            line.LinePattern = dashes ? Patterns[variants.IndexOf(variant) % Patterns.Length] : LinePattern.Solid;
            line.MarkerShape = Markers[k % Markers.Length];
            line.MarkerSize = 8;
            var whiskers = plot.Add.ErrorBar(px, median, above);
            whiskers.YErrorNegative = below;
            whiskers.Color = color;
            whiskers.LineWidth = 1;
            whiskers.CapSize = 4;
        }

        plot.Title(WrapTitle(figure.Title), 16);
        plot.XLabel(figure.XLabel);
        plot.YLabel(repetitions > 1
            ? $"Mops/s: median of {repetitions} runs; whiskers min to max"
            : "Mops/s (one run per point)");
        plot.Axes.Bottom.SetTicks(
            Enumerable.Range(0, n).Select(i => (double)i).ToArray(),
            xs.Select(x => figure.IsOversubscribed(x) ? x + "*" : x).ToArray());
        plot.Axes.SetLimitsX(-0.5, n - 0.5);
        plot.Axes.SetLimitsY(0, max > 0 ? max * 1.08 : 1);
        plot.ShowLegend(Edge.Right);
        return plot;
    }

    /// <summary>
    /// Sets the first sans-serif font this machine has; ScottPlot's own choice falls back to a serif font on a Linux box
    /// with only the DejaVu fonts.
    /// </summary>
    internal static void UseSansFont(Plot plot)
    {
        string[] families = SKFontManager.Default.GetFontFamilies();
        if (((string[])["DejaVu Sans", "Liberation Sans", "Arial", "Helvetica"]).FirstOrDefault(families.Contains) is string sans)
            plot.Font.Set(sans);
    }

    /// <summary>Splits "mechanism, variant" at its first comma; a name without one is a mechanism alone.</summary>
    internal static (string Mechanism, string Variant) Split(string series)
    {
        int comma = series.IndexOf(", ", StringComparison.Ordinal);
        return comma < 0 ? (series, "") : (series[..comma], series[(comma + 2)..]);
    }

    /// <summary>Breaks a title longer than fits above the data area into two lines, at the separator nearest the middle.</summary>
    internal static string WrapTitle(string title)
    {
        const int fits = 70;
        if (title.Length <= fits)
            return title;
        int best = -1;
        for (int i = 1; i < title.Length - 1; i++)
        {
            bool separator = title[i] == ' ' && (title[i - 1] == ',' || title[i + 1] == '(');
            if (separator && (best < 0 || Math.Abs(i - title.Length / 2) < Math.Abs(best - title.Length / 2)))
                best = i;
        }
        return best < 0 ? title : title[..best] + "\n" + title[(best + 1)..];
    }
}
