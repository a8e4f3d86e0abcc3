using System;
using System.Collections.Generic;
using System.Globalization;
using System.Linq;
using System.Net;
using System.Text;

namespace Epvs.Scaling.Harness;

/// <summary>
/// A small SVG line-plot writer (no plotting package is served by the package mirror): categorical x axis, linear y
/// axis from zero, one polyline per series with markers, a legend, and an optional shaded region for
/// oversubscribed thread counts.
/// </summary>
public sealed class SvgPlot
{
    private static readonly string[] Palette =
    [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
        "#393b79", "#637939",
    ];

    private static readonly string[] Dashes = ["", "6,3", "2,2", "8,3,2,3"];

    private readonly string title;
    private readonly string xLabel;
    private readonly string yLabel;
    private readonly IReadOnlyList<string> categories;
    private readonly List<(string Name, double[] Values, int Color, int Dash)> series = new();
    private int shadeFrom = -1;
    private string shadeLabel = "";

    /// <summary>Creates a plot.</summary>
    public SvgPlot(string title, string xLabel, string yLabel, IReadOnlyList<string> categories)
    {
        this.title = title;
        this.xLabel = xLabel;
        this.yLabel = yLabel;
        this.categories = categories;
    }

    /// <summary>Adds a series; NaN values are gaps. Series sharing a colour index differ by dash index.</summary>
    public void AddSeries(string name, double[] values, int color, int dash) => series.Add((name, values, color, dash));

    /// <summary>Shades the region from category <paramref name="index"/> to the right.</summary>
    public void ShadeFrom(int index, string label)
    {
        shadeFrom = index;
        shadeLabel = label;
    }

    /// <summary>The SVG document.</summary>
    public string Render()
    {
        const int left = 70, top = 40, plotW = 560, plotH = 340;
        int longest = series.Select(x => x.Name.Length).DefaultIfEmpty(10).Max();
        int width = left + plotW + 70 + (int)(longest * 6.6);
        int height = Math.Max(460, top + 20 + series.Count * 20);
        double max = series.SelectMany(s => s.Values).Where(v => !double.IsNaN(v)).DefaultIfEmpty(1).Max();
        double step = NiceStep(max / 5);
        double yMax = Math.Ceiling(max * 1.05 / step) * step;
        if (yMax <= 0)
            yMax = 1;
        int n = categories.Count;
        double X(int i) => left + (n == 1 ? plotW / 2.0 : plotW * (0.05 + 0.9 * i / (n - 1)));
        double Y(double v) => top + plotH - plotH * v / yMax;

        var sb = new StringBuilder();
        sb.AppendLine($"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">");
        sb.AppendLine($"<rect width=\"{width}\" height=\"{height}\" fill=\"white\"/>");
        sb.AppendLine($"<text x=\"{left + plotW / 2}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{Esc(title)}</text>");
        if (shadeFrom >= 0 && n > 0)
        {
            double x0 = shadeFrom == 0 ? left : (X(shadeFrom - 1) + X(shadeFrom)) / 2;
            sb.AppendLine($"<rect x=\"{F(x0)}\" y=\"{top}\" width=\"{F(left + plotW - x0)}\" height=\"{plotH}\" fill=\"#f2e6e6\"/>");
            sb.AppendLine($"<text x=\"{F(x0 + 4)}\" y=\"{top + 14}\" fill=\"#a05050\" font-size=\"11\">{Esc(shadeLabel)}</text>");
        }
        for (double v = 0; v <= yMax + step / 2; v += step)
        {
            double y = Y(v);
            sb.AppendLine($"<line x1=\"{left}\" y1=\"{F(y)}\" x2=\"{left + plotW}\" y2=\"{F(y)}\" stroke=\"#dddddd\"/>");
            sb.AppendLine($"<text x=\"{left - 6}\" y=\"{F(y + 4)}\" text-anchor=\"end\">{Esc(FormatTick(v))}</text>");
        }
        sb.AppendLine($"<rect x=\"{left}\" y=\"{top}\" width=\"{plotW}\" height=\"{plotH}\" fill=\"none\" stroke=\"#333333\"/>");
        for (int i = 0; i < n; i++)
        {
            sb.AppendLine($"<line x1=\"{F(X(i))}\" y1=\"{top + plotH}\" x2=\"{F(X(i))}\" y2=\"{top + plotH + 5}\" stroke=\"#333333\"/>");
            sb.AppendLine($"<text x=\"{F(X(i))}\" y=\"{top + plotH + 18}\" text-anchor=\"middle\">{Esc(categories[i])}</text>");
        }
        sb.AppendLine($"<text x=\"{left + plotW / 2}\" y=\"{top + plotH + 38}\" text-anchor=\"middle\">{Esc(xLabel)}</text>");
        sb.AppendLine($"<text x=\"18\" y=\"{top + plotH / 2}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {top + plotH / 2})\">{Esc(yLabel)}</text>");

        for (int s = 0; s < series.Count; s++)
        {
            (string name, double[] values, int colorIndex, int dashIndex) = series[s];
            string color = Palette[colorIndex % Palette.Length];
            string dash = Dashes[dashIndex % Dashes.Length];
            var segment = new List<string>();
            void Flush()
            {
                if (segment.Count > 1)
                    sb.AppendLine($"<polyline points=\"{string.Join(' ', segment)}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{(dash.Length > 0 ? $" stroke-dasharray=\"{dash}\"" : "")}/>");
                segment.Clear();
            }
            for (int i = 0; i < Math.Min(n, values.Length); i++)
            {
                if (double.IsNaN(values[i]))
                {
                    Flush();
                    continue;
                }
                segment.Add($"{F(X(i))},{F(Y(values[i]))}");
                sb.AppendLine($"<circle cx=\"{F(X(i))}\" cy=\"{F(Y(values[i]))}\" r=\"3.5\" fill=\"{color}\"><title>{Esc(name)} @ {Esc(categories[i])}: {Esc(FigureResult.Format(values[i]))}</title></circle>");
            }
            Flush();

            double ly = top + 10 + s * 20;
            int lx = left + plotW + 20;
            sb.AppendLine($"<line x1=\"{lx}\" y1=\"{F(ly)}\" x2=\"{lx + 24}\" y2=\"{F(ly)}\" stroke=\"{color}\" stroke-width=\"2\"{(dash.Length > 0 ? $" stroke-dasharray=\"{dash}\"" : "")}/>");
            sb.AppendLine($"<circle cx=\"{lx + 12}\" cy=\"{F(ly)}\" r=\"3.5\" fill=\"{color}\"/>");
            sb.AppendLine($"<text x=\"{lx + 30}\" y=\"{F(ly + 4)}\">{Esc(name)}</text>");
        }
        sb.AppendLine("</svg>");
        return sb.ToString();
    }

    private static double NiceStep(double raw)
    {
        if (raw <= 0)
            return 1;
        double mag = Math.Pow(10, Math.Floor(Math.Log10(raw)));
        double f = raw / mag;
        return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
    }

    private static string FormatTick(double v) => v.ToString(v >= 10 || v == 0 ? "0" : "0.###", CultureInfo.InvariantCulture);

    private static string F(double v) => v.ToString("0.#", CultureInfo.InvariantCulture);

    private static string Esc(string s) => WebUtility.HtmlEncode(s);
}
