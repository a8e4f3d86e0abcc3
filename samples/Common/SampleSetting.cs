using System;
using System.CommandLine;
using System.CommandLine.Parsing;

namespace Epvs.Samples;

/// <summary>
/// One setting of a sample's command line: a named option, optionally also a positional argument (the form the README's
/// older usage lines give), both parsed and range-checked the same way, with one default.
/// </summary>
/// <typeparam name="T">The setting's type.</typeparam>
public sealed class SampleSetting<T>
    where T : struct
{
    private readonly T _default;

    internal SampleSetting(string name, string? alias, string description, string helpName, T defaultValue, string? positional, Func<ArgumentResult, string, T?> parse)
    {
        _default = defaultValue;
        Option = alias is null ? new Option<T?>(name) : new Option<T?>(name, alias);
        Option.Description = description;
        Option.HelpName = helpName;
        Option.CustomParser = result => parse(result, name);
        if (positional is not null)
        {
            Argument = new Argument<T?>(positional)
            {
                Description = $"Same as {name} (positional form)",
                Arity = ArgumentArity.ZeroOrOne,
                CustomParser = result => parse(result, $"<{positional}>"),
            };
        }
    }

    /// <summary>The named form.</summary>
    public Option<T?> Option { get; }

    /// <summary>The positional form, or null.</summary>
    public Argument<T?>? Argument { get; }

    /// <summary>
    /// Adds the option (and the positional argument, if any) to <paramref name="command"/>, with a check that rejects
    /// a line giving both, so neither silently wins.
    /// </summary>
    /// <param name="command">The command.</param>
    public void AddTo(Command command)
    {
        ArgumentNullException.ThrowIfNull(command);
        command.Add(Option);
        if (Argument is not { } argument)
        {
            return;
        }

        command.Add(argument);
        command.Validators.Add(result =>
        {
            if (result.GetResult(Option) is { Tokens.Count: > 0 } && result.GetResult(argument) is { Tokens.Count: > 0 })
            {
                result.AddError($"{Option.Name} and <{argument.Name}> set the same thing: give one of them.");
            }
        });
    }

    /// <summary>The value given (positionally or by name), otherwise the default.</summary>
    /// <param name="parse">The parse result.</param>
    /// <returns>The setting.</returns>
    public T Value(ParseResult parse)
    {
        ArgumentNullException.ThrowIfNull(parse);
        return (Argument is null ? null : parse.GetValue(Argument)) ?? parse.GetValue(Option) ?? _default;
    }
}
